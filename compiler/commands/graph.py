"""`reccompile graph SPEC`: print the canonical text of the lowered fx graph."""

from __future__ import annotations

import argparse

from compiler.commands.common import add_spec_arguments, options_from_args, reporting_errors
from compiler.graph_text import graph_text
from compiler.pipeline import compile_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def action() -> int:
        print(graph_text(compile_spec(args.spec, options_from_args(args))), end="")
        return 0

    return reporting_errors(action)
