"""`reccompile data prepare SPEC --data READER:PATH -o DIR`: parse training data once into Parquet.

Reads the raw files once with the reader training would use, as the spec
declares them (runtime.data.prepared.prepare), several files in parallel
(one process per file, runtime.data.prepared.by_file), drops and reports bad rows
(file:line), and writes DIR: Parquet parts of fixed-size row groups and a
manifest. Without --workers, the files are parsed one process per file
only where that pays (several files, 3 or more usable cores:
runtime.data.prepared.parsing), and a line printed before parsing says how
many parse processes and why. A prepare stopped part-way (killed, Ctrl-C)
continues where it stopped when run again with the same arguments (in the
mode it started in); until it finishes, DIR holds no manifest and training
refuses it. `reccompile train --data prepared:DIR` then reads each rank's
rows only.

`reccompile data split --data movielens:PATH -o DIR [--holdout F]`: the
positives of a MovieLens file split by time per user into DIR/train and
DIR/test (runtime.data.movielens.split), for retrieval models.
`reccompile data split --data csv:PATH|parquet:PATH --time COL [--key COL]`
and `--data criteo:PATH`: any table's latest rows held out, per key or in
all (runtime.data.tables.split); run on DIR/train it cuts a validation part.

Prints what was prepared (split) and its throughput; exit status 0 when done,
1 for a spec or data error, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from compiler.commands.common import positive_int
from compiler.diagnostics import CompileError
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.reader_names import FILE_READERS, data_forms
from runtime.train.limits import MAX_PROCESSES, range_problem


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    prepare = actions.add_parser(
        "prepare",
        help="parse training data once into Parquet row groups and a manifest",
        description="Parse training data once into Parquet row groups and a manifest.",
    )
    prepare.add_argument("spec", help="the model spec (YAML)")
    prepare.add_argument(
        "--data", required=True, metavar="READER:PATH", help=f"the raw data: {data_forms(FILE_READERS)}"
    )
    prepare.add_argument("-o", "--outdir", type=Path, required=True, help="the prepared directory to write")
    prepare.add_argument(
        "--row-group-rows",
        type=positive_int,
        default=512,
        help="rows per row group (512): a rank reads rows / N when this divides "
        "its share of a batch (batch size / ranks)",
    )
    prepare.add_argument(
        "--part-row-groups",
        type=positive_int,
        default=256,
        help="row groups per Parquet file (256); a stopped prepare resumes after the last whole file",
    )
    prepare.add_argument(
        "--bad-rows",
        choices=("skip", "fail"),
        default="skip",
        help="drop bad rows and report them (skip, default) or stop at the first (fail)",
    )
    prepare.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes parsing: with several input files, one per file, at most this many at "
        "once; with one, workers sharing its lines; 0: none, line by line in this process. "
        "Default: one per file when there are several files and 3 or more usable cores "
        "(as many as files and cores but one: the prepare's own process stitches the "
        "files' rows into parts), else line by line; the prepare prints which and why",
    )
    prepare.add_argument("--rating-threshold", type=float, default=4.0, help="MovieLens: rating >= T is a positive (4)")
    prepare.add_argument(
        "--training",
        metavar="READER:PATH",
        help="MovieLens evaluation data: map ids with the vocabulary of these training ratings and "
        "start histories in them, as --eval-data movielens: does; train --eval-data prepared: "
        "refuses evaluation data prepared without the training vocabulary. csv or parquet "
        "evaluation data: apply the features learned from these training files",
    )
    split = actions.add_parser(
        "split",
        help="data split by time into train/ and test/ (the latest rows held out)",
        description="Rows split by time: the latest --holdout of each --key's rows (or of "
        "all rows) go to DIR/test, the rest to DIR/train, in the input's format. "
        "MovieLens: the positives (rating >= threshold) of each user by timestamp. "
        "CSV and Parquet: ordered by --time. Criteo: the latest lines (its "
        "files are in time order).",
    )
    split.add_argument(
        "--data",
        required=True,
        metavar="READER:PATH",
        help="movielens:PATH, csv:PATH, parquet:PATH or criteo:PATH (a file or a directory of them)",
    )
    split.add_argument("-o", "--outdir", type=Path, required=True, help="the directory to write train/ and test/ in")
    split.add_argument(
        "--holdout",
        type=float,
        default=0.2,
        help="the share of each key's latest rows held out (0.2; at most all but one)",
    )
    split.add_argument("--time", metavar="COLUMN", help="csv, parquet: the column the rows are ordered by (numbers)")
    split.add_argument(
        "--key",
        metavar="COLUMN",
        help="csv, parquet: hold out the latest rows of each value of this column (e.g. the user), "
        "not the latest rows of the whole table",
    )
    split.add_argument("--rating-threshold", type=float, default=4.0, help="movielens: rating >= T is a positive (4)")


def run(args: argparse.Namespace) -> int:
    if args.action == "split":
        return _split(args)
    if args.workers is not None and args.workers < 0:
        print(f"error: --workers must be 0 or more, got {args.workers}", file=sys.stderr)
        return 2
    problem = None if args.workers is None else range_problem("--workers", args.workers, 0, MAX_PROCESSES)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        ir = validate(load(args.spec))
    except CompileError as error:
        print(error, file=sys.stderr)
        return 1
    # The runtime (and torch, pyarrow) load only once the spec is good.
    from compiler.lowering.instantiate import model_inputs
    from runtime.data.errors import DataError
    from runtime.data.sources import choose_data
    from runtime.storage.output import OutputError

    inputs = model_inputs(ir)
    try:
        choice = choose_data(args.data, inputs)
        if choice.reader not in FILE_READERS:
            print(f"error: --data {args.data}: prepare reads {' or '.join(FILE_READERS)} data", file=sys.stderr)
            return 2
        from runtime.data.prepared.manifest import MANIFEST
        from runtime.data.prepared.prepare import PrepareSettings, prepare

        training = None if args.training is None else choose_data(args.training, inputs)
        if training is not None and (training.reader != choice.reader or choice.reader == "criteo"):
            print(
                f"error: --training {args.training}: applies to movielens, csv or parquet data, read as --data is",
                file=sys.stderr,
            )
            return 2
        settings = PrepareSettings(
            row_group_rows=args.row_group_rows,
            part_row_groups=args.part_row_groups,
            bad_rows=args.bad_rows,
            workers=args.workers,
            rating_threshold=args.rating_threshold,
            training=None if training is None else training.path,
        )
        finished = (args.outdir / MANIFEST).is_file()
        started = time.perf_counter()
        manifest = prepare(inputs, choice, args.outdir, settings, report=_say)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OutputError as error:  # the parts written are kept: a run again continues from them
        print(f"error: {error}; once it can be written, run the same command again to continue", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to continue the prepare in {args.outdir}", file=sys.stderr)
        return 130
    if finished:
        return 0  # prepare said so: nothing to do
    seconds = time.perf_counter() - started
    source = manifest.source
    groups = sum(len(part.row_groups) for part in manifest.files)
    print(
        f"prepared {manifest.rows:,} rows of {source['lines']:,} lines ({_count(source['bad_rows'], 'bad row')} "
        f"dropped) into {args.outdir}: {_count(len(manifest.files), 'file')}, {_count(groups, 'row group')} of up "
        f"to {manifest.row_group_rows:,} rows; {seconds:.1f} s, {manifest.rows / max(seconds, 1e-9):,.0f} rows/s"
    )
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' if n != 1 else ''}"


def _split(args: argparse.Namespace) -> int:
    from runtime.data.tables.split import SPLIT_READERS

    reader, colon, path = args.data.partition(":")
    if reader not in SPLIT_READERS or not colon or not path:
        print(
            f"error: --data {args.data}: split reads {', '.join(f'{r}:PATH' for r in SPLIT_READERS)}", file=sys.stderr
        )
        return 2
    if not 0.0 < args.holdout < 1.0:
        print(f"error: --holdout must be between 0 and 1 (exclusive), got {args.holdout:g}", file=sys.stderr)
        return 2
    if reader in ("movielens", "criteo") and (args.time is not None or args.key is not None):
        given = "--time" if args.time is not None else "--key"
        why = "users and timestamps are its own" if reader == "movielens" else "its lines are in time order"
        print(f"error: {given}: {reader} data is split without it ({why})", file=sys.stderr)
        return 2
    if reader in ("csv", "parquet") and args.time is None:
        print(f"error: --data {args.data}: name the column the rows are ordered by (--time COLUMN)", file=sys.stderr)
        return 2
    from runtime.data.errors import DataError
    from runtime.data.movielens.split import split_by_time
    from runtime.data.tables.split import split_table
    from runtime.storage.output import OutputError, removed_on_error

    try:  # the split refuses an existing train/ or test/: on failure, what it made goes
        with removed_on_error(args.outdir, args.outdir / "train", args.outdir / "test"):
            if reader == "movielens":
                split = split_by_time(path, args.outdir, threshold=args.rating_threshold, holdout=args.holdout)
            else:
                split = split_table(reader, path, args.outdir, time=args.time, key=args.key, holdout=args.holdout)
    except (DataError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"split {split.describe()}")
    return 0


def _say(message: str) -> None:
    print(message, file=sys.stderr if message.startswith("warning:") else sys.stdout, flush=True)
