"""`reccompile retrieve OUT --data ... --k K -o results.csv`: top-k items per request from an export.

    reccompile retrieve OUT --data synthetic|movielens:FILE|csv:FILE|... [--history movielens:TRAIN]
                        [--k K] [--batch-size B]
                        [--rows N] [--seed S] [--bad-rows fail|skip]
                        [--threads T] [--no-verify] -o results.csv

Loads the export directory OUT of a retrieval model (checked against its
manifest, the index against its own) without compiling anything, runs the
query tower on every request and looks its top K up in the index; writes K
CSV rows per request (runtime/serving/retrieve.py) and reports requests/s and
the threads (`--threads` or the cores free at launch, runtime/cpu/threads.py).
A `--k` above the index's item count is clamped to it, with a note: the
results are sized by the catalogue, never by the number typed.

A next-item model's requests take their histories from `--history` (the
training ratings they were split from) and their own file; requests with no
history get no rows and are counted in the report.

Exit status 1 when the export, its index or the data is bad (the first bad
row under `--bad-rows fail`, named by file and line), 2 for bad usage (an `-o` that is a
directory, a file `--data` reads, or inside OUT is refused before anything is read).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compiler.commands.common import output_file_problem, positive_int, whole_number_in
from runtime.data.reader_names import FILE_READERS, data_forms
from runtime.train.limits import MAX_BATCH_SIZE, MAX_SEED, MAX_THREADS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export", metavar="OUT", type=Path, help="the export directory of a retrieval model")
    parser.add_argument(
        "--data",
        default="synthetic",
        help=f"the requests: {data_forms(('synthetic', *FILE_READERS), bare='PATH')} (default synthetic)",
    )
    parser.add_argument(
        "--history",
        metavar="movielens:TRAIN",
        help="next-item models: the training ratings the requests were split from, where each "
        "request's history (the user's earlier positives) is cut from",
    )
    parser.add_argument(
        "--k",
        type=positive_int,
        default=10,
        help="items per request (default 10; more than the index holds: all of them, with a note)",
    )
    parser.add_argument(
        "--batch-size", type=whole_number_in(1, MAX_BATCH_SIZE), default=512, help="requests per batch (default 512)"
    )
    parser.add_argument("--rows", type=positive_int, default=16, help="synthetic requests (default 16)")
    parser.add_argument(
        "--seed", type=whole_number_in(0, MAX_SEED), help="synthetic data seed (default: the spec's training.seed)"
    )
    parser.add_argument(
        "--bad-rows",
        choices=("fail", "skip"),
        default="fail",
        help="stop at the first bad line (default) or count, report and skip them",
    )
    parser.add_argument(
        "--threads", type=whole_number_in(1, MAX_THREADS), help="torch intra-op threads (default: the free cores)"
    )
    parser.add_argument(
        "--no-verify", dest="verify", action="store_false", help="check file sizes only, not their sha256"
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="the CSV file to write")


def run(args: argparse.Namespace) -> int:
    import torch

    from runtime.cpu.allocator import frozen_objects
    from runtime.cpu.threads import process_threads
    from runtime.data.errors import DataError
    from runtime.data.sources import read_paths
    from runtime.retrieval.index_files import IndexFileError, load_index
    from runtime.serving.export_dir import ExportError, data_file, load, read_export_manifest
    from runtime.serving.retrieve import retrieve_file
    from runtime.storage.output import OutputError

    reads = read_paths(args.data) + (() if args.history is None else read_paths(args.history))
    problem = output_file_problem("-o", args.output, export=args.export, reads=reads)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    threads = process_threads(args.threads)
    torch.set_num_threads(threads.threads)
    try:
        section = read_export_manifest(args.export).get("retrieval")
        if section is None:
            print(
                f"error: {args.export}: not a retrieval model (no sampled_softmax head, no index); "
                "score it with reccompile predict",
                file=sys.stderr,
            )
            return 1
        module, model = load(args.export, verify=args.verify)
        index = load_index(args.export / section["index"]["directory"], verify=args.verify)
        k = min(args.k, len(index.ids))
        if k < args.k:
            print(
                f"note: --k {args.k:,} is more than the {k:,} items of the index: retrieving all {k:,}", file=sys.stderr
            )
        with frozen_objects():  # the loaded model and index are no garbage: full collections skip them
            report = retrieve_file(
                model,
                module,
                index,
                args.output,
                data=args.data,
                k=k,
                batch_size=args.batch_size,
                rows=args.rows,
                seed=module.INPUTS.training.seed if args.seed is None else args.seed,
                bad_rows_policy=args.bad_rows,
                vocabulary=data_file(args.export, "vocabulary", verify=args.verify),
                features=data_file(args.export, "features", verify=args.verify),
                warn=lambda message: print(f"warning: {message}", file=sys.stderr),
                history=args.history,
            )
    except (ExportError, IndexFileError, DataError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if report.bad_rows_summary is not None:
        print(report.bad_rows_summary, file=sys.stderr)
    if report.no_history:
        source = "--history and the requests file" if args.history else "the requests file (no --history)"
        print(
            f"warning: {report.no_history:,} of {report.requests:,} requests have no history in {source}: "
            "no items written for them",
            file=sys.stderr,
        )
    print(
        f"wrote the top {k} of {section['items']:,} items ({section['index']['kind']} index) for "
        f"{report.requests:,} requests to {args.output} in {report.seconds:.2f} s: "
        f"{report.requests_per_s:,.0f} requests/s (query tower {report.query_seconds:.3f} s, "
        f"index {report.search_seconds:.3f} s) on {threads.describe()}; {report.bad_rows:,} bad rows skipped"
        + (f"; {report.no_history:,} requests without a history" if report.no_history else "")
        + ("" if report.unseen is None else f"; {report.unseen.describe()}")
    )
    return 0
