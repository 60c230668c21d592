"""`reccompile check SPEC...`: validate specs and print every diagnostic.

Prints `SPEC: ok` for each good spec and the diagnostics of each bad one
(stderr, sorted by position, then the error count). Exit status: 0 when
every spec is good, 1 when any has errors (2 for bad usage, from argparse).
"""

from __future__ import annotations

import argparse
import sys

from compiler.diagnostics import CompileError
from compiler.spec.load import load
from compiler.spec.validate import validate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="model spec files (YAML)")


def run(args: argparse.Namespace) -> int:
    status = 0
    for spec in args.specs:
        try:
            validate(load(spec))
        except CompileError as error:
            print(error, file=sys.stderr)
            status = 1
        else:
            print(f"{spec}: ok")
    return status
