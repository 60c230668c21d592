"""`reccompile predict OUT --data ... -o predictions.csv`: score samples with an exported model.

    reccompile predict OUT --data synthetic|criteo:FILE|movielens:FILE|csv:FILE|... [--batch-size B]
                       [--rows N] [--seed S] [--bad-rows fail|skip] [--threads T] [--no-verify]
                       -o predictions.csv

Loads the export directory OUT (checked against its manifest) without
compiling anything, streams the data through the model and writes one CSV
row per sample (see runtime/serving/predict.py); reports rows/s, the threads
(`--threads` or the cores free at launch, runtime/cpu/threads.py), bad rows and,
for MovieLens, the ids outside the training vocabulary (scored with row 0). Exit status 1 when
the export or the data is bad (the first bad row under `--bad-rows fail`), 2 for bad usage: an
`-o` that is a directory, a file `--data` reads, or inside OUT is refused before anything is read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from compiler.commands.common import output_file_problem, positive_int, whole_number_in
from runtime.cpu.threads import process_threads
from runtime.data.reader_names import FILE_READERS, data_forms
from runtime.train.limits import MAX_BATCH_SIZE, MAX_SEED, MAX_THREADS
from runtime.serving.export_dir import ExportError, data_file, load, read_export_manifest
from runtime.serving.predict import predict_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export", metavar="OUT", type=Path, help="an export directory (reccompile export)")
    parser.add_argument(
        "--data",
        default="synthetic",
        help=f"the samples: {data_forms(('synthetic', *FILE_READERS), bare='PATH')} (default synthetic)",
    )
    parser.add_argument(
        "--batch-size", type=whole_number_in(1, MAX_BATCH_SIZE), default=512, help="samples per forward (default 512)"
    )
    parser.add_argument("--rows", type=positive_int, default=4096, help="synthetic samples (default 4096)")
    parser.add_argument(
        "--seed", type=whole_number_in(0, MAX_SEED), help="synthetic data seed (default: the spec's training.seed)"
    )
    parser.add_argument(
        "--bad-rows",
        choices=("fail", "skip"),
        default="fail",
        help="stop at the first bad row (default) or count, report and skip them",
    )
    parser.add_argument("--rating-threshold", type=float, help="MovieLens positives: rating >= T (default 4)")
    parser.add_argument(
        "--threads", type=whole_number_in(1, MAX_THREADS), help="torch intra-op threads (default: the free cores)"
    )
    parser.add_argument(
        "--no-verify", dest="verify", action="store_false", help="check file sizes only, not their sha256"
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="the CSV file to write")


def run(args: argparse.Namespace) -> int:
    from runtime.cpu.allocator import frozen_objects, retain_freed_memory
    from runtime.data.errors import DataError
    from runtime.data.sources import read_paths
    from runtime.storage.output import OutputError

    problem = output_file_problem("-o", args.output, export=args.export, reads=read_paths(args.data))
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    threads = process_threads(args.threads)
    torch.set_num_threads(threads.threads)
    retain_freed_memory()
    try:
        if "retrieval" in read_export_manifest(args.export):
            print(
                f"error: {args.export}: a retrieval model scores no samples; use reccompile retrieve", file=sys.stderr
            )
            return 1
        module, model = load(args.export, verify=args.verify)
        vocabulary = data_file(args.export, "vocabulary", verify=args.verify)
        with frozen_objects():  # the loaded model is no garbage: full collections skip it
            report = predict_file(
                model,
                module.INPUTS,
                args.output,
                data=args.data,
                batch_size=args.batch_size,
                rows=args.rows,
                seed=module.INPUTS.training.seed if args.seed is None else args.seed,
                bad_rows_policy=args.bad_rows,
                rating_threshold=args.rating_threshold,
                vocabulary=vocabulary,
                features=data_file(args.export, "features", verify=args.verify),
                warn=lambda message: print(f"warning: {message}", file=sys.stderr),
            )
    except (ExportError, DataError, IndexError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if report.bad_rows_summary is not None:
        print(report.bad_rows_summary, file=sys.stderr)
    print(
        f"wrote {report.rows:,} prediction{'' if report.rows == 1 else 's'} to {args.output} "
        f"in {report.seconds:.2f} s: "
        f"{report.rows_per_s:,.0f} rows/s ({report.model_rows_per_s:,.0f} rows/s in the model) "
        f"on {threads.describe()}; "
        f"{report.bad_rows:,} bad row{'' if report.bad_rows == 1 else 's'} skipped"
        + ("" if report.unseen_ids is None else f"; {report.unseen_ids.describe()}")
    )
    return 0
