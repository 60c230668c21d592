"""`reccompile graph SPEC [--stages] [--golden FILE [--update]]`: the canonical text of the fx graph.

With `--stages`, the graph as the pipeline cuts it: the generated Model's
`input_dist` (stage 0), `compute` (stage 1) and `forward`. With `--golden
FILE`, the text is compared with FILE instead of printed: a difference is
printed as a unified diff and exits 1; `--update` rewrites FILE (see
compiler/golden.py for the same check inside a pytest).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from compiler.commands.common import add_spec_arguments, options_from_args, reporting_errors
from compiler.golden import GoldenMismatch, check_graph, current_graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument("--stages", action="store_true", help="show the two pipeline stages the graph is cut into")
    parser.add_argument("--golden", metavar="FILE", help="compare with FILE: exit 1 with a diff when it differs")
    parser.add_argument("--update", action="store_true", help="with --golden: rewrite FILE with the current text")


def run(args: argparse.Namespace) -> int:
    if args.update and args.golden is None:
        print("reccompile graph: error: --update needs --golden FILE", file=sys.stderr)
        return 2

    options = options_from_args(args)

    def action() -> int:
        if args.golden is None:
            print(current_graph(args.spec, options, stages=args.stages), end="")
            return 0
        try:
            written = check_graph(args.spec, args.golden, update=args.update, options=options, stages=args.stages)
        except GoldenMismatch as mismatch:
            message = mismatch.explain(_update_command(args))
            print(f"error: {message}", end="" if message.endswith("\n") else "\n", file=sys.stderr)
            return 1
        print(f"{args.golden}: {'written' if written else 'unchanged'}")
        return 0

    return reporting_errors(action)


def _update_command(args: argparse.Namespace) -> str:
    """The command line that writes to the golden file what this one compared with it."""
    words = ["reccompile", "graph", args.spec]
    for flag, value in (
        ("--world-size", args.world_size),
        ("--ranks-per-host", args.ranks_per_host),
        ("--memory-per-rank", args.memory_per_rank),
        ("--plan", args.plan_file),
    ):
        words += [] if value is None else [flag, str(value)]
    words += ["--stages"] if args.stages else []
    return shlex.join([*words, "--golden", args.golden, "--update"])
