"""`reccompile check SPEC...`: compile specs as far as code generation, and print every diagnostic.

Prints `SPEC: ok` for each good spec and the diagnostics of each bad one
(stderr, sorted by position, then the error count). A spec is planned as
`reccompile plan` would (`--world-size`, `--ranks-per-host`,
`--memory-per-rank` as there), so a model whose tables do not fit its ranks
fails here, naming the tables, the bytes and the world size that would fit, and so
does a graph whose shapes do not fit or whose dense blocks leave no room (the
lowering's checks). With `--data PATH` (or without it, the files the
spec's `data:` section names, which `train` reads by default) the
first `--sample` rows of a data file are parsed against each good spec too,
and the output says which lines were not; MovieLens ids are read from the
whole file, so every table is checked against the vocabulary training will
build (see runtime/data/sample_check.py): bad rows and mapping errors as
`FILE:LINE: error: ...` on stderr, a summary of the good rows on stdout.
`--data prepared:DIR` checks the manifest's columns against the spec and
every file against its sha256. Exit status: 0
when every spec (and the data) is good, 1 when any has errors (2 for bad
usage, from argparse).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from compiler.commands.common import memory_size, positive_int
from compiler.diagnostics import CompileError
from compiler.ir import ModelIR
from compiler.pipeline import Options, compile_spec
from runtime.data.reader_names import READERS, data_forms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="model spec files (YAML)")
    parser.add_argument(
        "--data",
        metavar="PATH",
        help="check the first rows of this data against each spec: "
        f"{data_forms(READERS[1:], bare='PATH (the reader the spec names)')}",
    )
    parser.add_argument("--world-size", type=positive_int, help="ranks to plan for (default: the spec's)")
    parser.add_argument("--ranks-per-host", type=positive_int, help="ranks on each host (default: all on one)")
    parser.add_argument(
        "--memory-per-rank", type=memory_size, help="memory of each rank, e.g. 16GiB (default: the device's)"
    )
    parser.add_argument(
        "--sample",
        type=_rows,
        default=1000,
        metavar="N",
        help="rows of --data to parse (1000); MovieLens ids are read from every row",
    )


def run(args: argparse.Namespace) -> int:
    status = 0
    options = Options(
        world_size=args.world_size, ranks_per_host=args.ranks_per_host, memory_per_rank=args.memory_per_rank
    )
    for spec in args.specs:
        try:
            ir = compile_spec(spec, options).ir  # every pass but code generation
        except CompileError as error:
            print(error, file=sys.stderr)
            status = 1
        else:
            print(f"{spec}: ok")
            _warn_precision(ir)
            if not _check_data(ir, args.data, args.sample):
                status = 1
    return status


def _warn_precision(ir: ModelIR) -> None:
    """bf16 training on a CPU without bf16 arithmetic: a warning here, where the CPU that trains may be
    another; the training worker refuses it (runtime.train.precision)."""
    from runtime.train.precision import BF16_FLAGS, bf16_supported

    training = ir.training
    if training.precision == "bf16" and ir.sharding.device == "cpu" and not bf16_supported():
        from runtime.cpu.features import model

        print(
            f"{training.precision_loc or training.loc}: warning: training precision bf16: this machine's CPU "
            f"({model()}) has no bf16 arithmetic ({', '.join(BF16_FLAGS)}); training would refuse it here",
            file=sys.stderr,
        )


def _check_data(ir: ModelIR, data: str | None, rows: int) -> bool:
    """Check `rows` rows of `data` (None: the spec's own data section, as `train` reads it, if it names
    files) against the spec; print what was found; True when good."""
    if data is None and (ir.data is None or ir.data.reader == "synthetic"):
        return True  # nothing to read, and no need to load the runtime
    # The runtime (and torch) load only when data is to be checked.
    from compiler.lowering.instantiate import model_inputs
    from runtime.data.errors import DataError
    from runtime.data.sample_check import check_sample
    from runtime.data.sources import choose_data

    inputs = model_inputs(ir)
    try:
        choice = choose_data(data, inputs)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return False
    if choice.reader == "synthetic":
        print("synthetic data: nothing to check")
        return True
    if choice.reader == "prepared":
        return _check_prepared(inputs, choice.path)
    try:
        report = check_sample(inputs, choice, rows)
    except DataError as error:  # the file cannot be read at all (missing, truncated)
        print(f"error: {error}", file=sys.stderr)
        return False
    for line in report.notes:
        print(line)
    for line in report.warnings:
        print(line, file=sys.stderr)
    for line in report.errors:
        print(line, file=sys.stderr)
    if report.errors:
        count = len(report.errors)
        print(f"{count} error{'s' if count != 1 else ''}", file=sys.stderr)
    return not report.errors


def _check_prepared(inputs: Any, path: str | None) -> bool:
    """The manifest's columns against the spec, and every part against its size and sha256."""
    from runtime.data.errors import DataError
    from runtime.data.prepared.manifest import check_files
    from runtime.data.prepared.reading import open_prepared

    try:
        prepared = open_prepared(inputs, path or "")
        check_files(prepared.manifest, hashes=True)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return False
    manifest = prepared.manifest
    print(
        f"{path}: {manifest.rows:,} prepared rows in {len(manifest.files)} files fit the spec; every file matches its sha256"
    )
    return True


def _rows(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)
