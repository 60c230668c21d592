"""`reccompile show SPEC`: print the fully resolved spec (the IR's text form).

Defaults filled in, `count:` expanded, `sparse.*` spelled out, every width
inferred; see `compiler.ir_text`. Errors are printed like `reccompile check`.
"""

from __future__ import annotations

import argparse
import sys

from compiler.diagnostics import CompileError
from compiler.ir_text import format_ir
from compiler.spec.load import load
from compiler.spec.validate import validate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="the model spec (YAML)")


def run(args: argparse.Namespace) -> int:
    try:
        ir = validate(load(args.spec))
    except CompileError as error:
        print(error, file=sys.stderr)
        return 1
    sys.stdout.write(format_ir(ir))
    return 0
