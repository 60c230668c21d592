"""`reccompile graph SPEC [--stages]`: print the canonical text of the lowered fx graph.

With `--stages`, the graph as the pipeline cuts it: the generated Model's
`input_dist` (stage 0), `compute` (stage 1) and `forward`.
"""

from __future__ import annotations

import argparse

from compiler.commands.common import add_spec_arguments, options_from_args, reporting_errors
from compiler.lowering.graph_text import graph_text, stages_text
from compiler.pipeline import compile_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument(
        "--stages", action="store_true", help="show the two pipeline stages the graph is cut into"
    )


def run(args: argparse.Namespace) -> int:
    def action() -> int:
        lowered = compile_spec(args.spec, options_from_args(args))
        print((stages_text if args.stages else graph_text)(lowered), end="")
        return 0

    return reporting_errors(action)
