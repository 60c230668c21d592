"""`reccompile SPEC`: check, plan, and write `<name>.py` and `<name>.plan.json`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from compiler.codegen.emit import emit
from compiler.commands.common import add_spec_arguments, options_from_args, outdir_problem, reporting_errors
from compiler.lowering.calls import aux_loss_blocks, aux_loss_call
from compiler.lowering.instantiate import build_call
from compiler.lowering.types import Call, LoweredModel
from compiler.pipeline import compile_spec
from compiler.planner.plan import ShardingPlan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument("-o", "--outdir", type=Path, default=Path("build"), help="default: build/")


def run(args: argparse.Namespace) -> int:
    problem = outdir_problem("-o", args.outdir)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    def action() -> int:
        lowered = compile_spec(args.spec, options_from_args(args))
        written = emit(lowered).write(args.outdir)
        print(summary(lowered, [str(p) for p in written]))
        return 0

    return reporting_errors(action)


def summary(lowered: LoweredModel, written: list[str]) -> str:
    """One screen: the model, its tables, parameter counts, the plan and the files."""
    ir, plan = lowered.ir, lowered.plan
    embedding_params = sum(t.num_embeddings * t.dim for t in ir.tables)
    calls = [d.call for d in lowered.modules if d.target != "sparse_arch"]
    calls += [aux_loss_call(ir, block) for block in aux_loss_blocks(ir)]  # trained, never exported
    dense_params = sum(_call_params(call) for call in calls)
    lines = [
        f"{ir.name}: {len(ir.dense)} dense and {len(ir.sparse)} sparse features, "
        f"{len(ir.tables)} tables, {len(ir.blocks)} blocks, {len(ir.heads)} head" + ("s" if len(ir.heads) != 1 else ""),
        f"parameters: {embedding_params:,} in embeddings, {dense_params:,} dense",
        f"plan: world size {plan.world_size} on {plan.device}; "
        + ", ".join(f"{n} {t}" for t, n in _count_types(plan).items()),
    ]
    lines += [f"wrote {path}" for path in written]
    return "\n".join(lines)


def _count_types(plan: ShardingPlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for table in plan.tables:
        counts[table.sharding_type] = counts.get(table.sharding_type, 0) + 1
    return counts


def _call_params(call: Call) -> int:
    with torch.device("meta"):
        module = build_call(call, {"process_group": None})
    return sum(p.numel() for p in module.parameters())
