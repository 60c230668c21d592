"""`reccompile plan SPEC`: print the sharding plan of a spec (a table, or plan.json with --json).

    reccompile plan SPEC [--world-size N] [--ranks-per-host K] [--memory-per-rank 16GiB]
                         [--plan FILE] [--json]

With --plan, the given plan is checked against the spec and printed with
the planner's estimates instead of a new plan. Exit status 1 when the spec
or the plan has errors, or the model does not fit.
"""

from __future__ import annotations

import argparse

from compiler.commands.common import add_spec_arguments, options_from_args, reporting_errors
from compiler.pipeline import apply_options
from compiler.planner.check import read_plan
from compiler.planner.planner import plan, topology_from_ir
from compiler.planner.report import format_plan
from compiler.spec.load import load
from compiler.spec.validate import validate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as plan.json instead of a table")


def run(args: argparse.Namespace) -> int:
    def action() -> int:
        options = options_from_args(args)
        ir = apply_options(validate(load(args.spec), options.world_size), options)
        topology = topology_from_ir(ir, ranks_per_host=options.ranks_per_host, memory_per_rank=options.memory_per_rank)
        if options.plan_file is not None:
            result = read_plan(options.plan_file, ir, topology)
        else:
            result = plan(ir, topology)
        print(result.to_json() if args.json else format_plan(ir, topology, result), end="")
        return 0

    return reporting_errors(action)
