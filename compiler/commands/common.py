"""What the commands share: the spec and planning options, checks of output paths, error reporting."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

from compiler.diagnostics import CompileError
from compiler.pipeline import Options
from compiler.planner.fit import MAX_WORLD_SIZE
from compiler.planner.topology import parse_bytes
from runtime.storage.output import OutputError


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the model spec (YAML)")
    parser.add_argument(
        "--world-size",
        type=whole_number_in(1, MAX_WORLD_SIZE),
        help=f"ranks to plan for, at most {MAX_WORLD_SIZE:,} (default: the spec's)",
    )
    parser.add_argument(
        "--ranks-per-host", type=whole_number_in(1, MAX_WORLD_SIZE), help="ranks on each host (default: all on one)"
    )
    parser.add_argument(
        "--memory-per-rank", type=memory_size, help="memory of each rank, e.g. 16GiB (default: the device's)"
    )
    parser.add_argument("--plan", type=Path, dest="plan_file", help="use this plan.json instead of planning")


def options_from_args(args: argparse.Namespace, **overrides: object) -> Options:
    values = dict(
        world_size=args.world_size,
        ranks_per_host=args.ranks_per_host,
        memory_per_rank=args.memory_per_rank,
        plan_file=args.plan_file,
        batch_size=getattr(args, "batch_size", None),
    )
    values.update(overrides)
    return Options(**values)  # type: ignore[arg-type]


def outdir_problem(flag: str, path: Path) -> str | None:
    """Why `path` cannot be the output directory `flag` names, or None."""
    if path.exists() and not path.is_dir():
        return f"{flag} {path}: exists and is not a directory"
    return None


def output_file_problem(flag: str, output: Path, *, export: Path, reads: Iterable[Path]) -> str | None:
    """Why `output` cannot be the file `flag` names for a command reading the export directory
    `export` and the data `reads` (files or directories), or None. Checked before anything is
    written: the file is replaced whole once complete, so naming an input would destroy it."""
    if output.is_dir():
        return f"{flag} {output}: is a directory; name the CSV file to write"
    target = output.resolve()
    if target.is_relative_to(export.resolve()):
        return f"{flag} {output}: inside the export directory {export}; writing there would damage the export"
    for path in reads:
        if path.is_dir() and target.is_relative_to(path.resolve()):
            return f"{flag} {output}: inside the --data directory {path}, whose files are all read as data"
        if target == path.resolve() or (output.exists() and path.exists() and os.path.samefile(output, path)):
            return f"{flag} {output}: is the --data file {path}; writing it would destroy the input"
    return None


def reporting_errors(action: Callable[[], int]) -> int:
    """Run `action`; print a CompileError's diagnostics, or the line of an output it could not write
    (a full disk, a read-only folder), to stderr and return 1."""
    try:
        return action()
    except CompileError as error:
        print(str(error), file=sys.stderr)
        return 1
    except OutputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def whole_number_in(least: int, most: int) -> Callable[[str], int]:
    """argparse type: a whole number from `least` to `most` (runtime/train/limits.py: no memory is ever
    sized by a number past them)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"must be between {least:,} and {most:,}, got {value}")
        return value

    return parse


def memory_size(text: str) -> int:
    """argparse type: a size such as 16GiB."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
