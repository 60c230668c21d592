"""The compiler from start to finish: read this file first.

    spec.yaml -> load -> validate -> overrides -> plan -> lower -> read one position -> check shapes
              -> check dense memory -> split -> emit

Each step is one call of one module's entry function; each raises
CompileError with every diagnostic it found.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from compiler.codegen.emit import GeneratedModule, emit
from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import ModelIR
from compiler.lowering.dense_memory import check_dense_memory
from compiler.lowering.lower import lower
from compiler.lowering.one_position import read_one_position
from compiler.lowering.shapes import check_shapes
from compiler.lowering.split import split_stages
from compiler.lowering.types import SplitModel
from compiler.planner.check import read_plan
from compiler.planner.planner import plan, topology_from_ir
from compiler.spec.load import load
from compiler.spec.validate import validate


@dataclass(frozen=True, slots=True)
class Options:
    """Command-line values that win over the spec's own."""

    world_size: int | None = None
    ranks_per_host: int | None = None
    # Ranks the launcher starts on each host (torchrun's local world size): the host
    # size when neither ranks_per_host nor the spec's sharding.ranks_per_host gives one.
    launched_ranks_per_host: int | None = None
    memory_per_rank: int | None = None
    batch_size: int | None = None
    plan_file: Path | None = None


def compile_spec(path: str, options: Options = Options()) -> SplitModel:
    """Spec file -> checked, lowered model (the fx graph, its two stages and its submodules)."""
    document = load(path)  # YAML -> a tree that keeps file:line:col for every node
    ir = validate(document, options.world_size)  # JSON Schema + semantic checks -> frozen, resolved ModelIR
    ir = apply_options(ir, options)  # the command line's world size, batch size and host size win
    topology = topology_from_ir(ir, ranks_per_host=options.ranks_per_host, memory_per_rank=options.memory_per_rank)
    if options.plan_file is not None:
        sharding_plan = read_plan(options.plan_file, ir, topology)  # a given plan, checked
    else:
        sharding_plan = plan(ir, topology)  # cost model -> balanced, feasible ShardingPlan
    lowered = lower(ir, sharding_plan)  # fx graph: input_dist, lookup, output_dist, blocks, heads
    lowered = read_one_position(lowered)  # a transformer only pooled at first/last computes that position
    lowered = check_shapes(lowered)  # meta tensors through the graph; widths checked
    lowered = check_dense_memory(lowered)  # replicated blocks, gradients, optimizer state beside the tables
    return split_stages(lowered)  # the graph cut for the pipeline: input_dist | compute


def generate(path: str, options: Options = Options()) -> GeneratedModule:
    """Spec file -> the text of the generated module and its plan."""
    return emit(compile_spec(path, options))  # jinja2 -> <name>.py and <name>.plan.json


def apply_options(ir: ModelIR, options: Options) -> ModelIR:
    sharding, training = ir.sharding, ir.training
    if options.world_size is not None:
        sharding = dataclasses.replace(sharding, world_size=options.world_size)
    if options.batch_size is not None:
        training = dataclasses.replace(training, batch_size=options.batch_size)
    if sharding.ranks_per_host is None and options.launched_ranks_per_host is not None:
        sharding = dataclasses.replace(sharding, ranks_per_host=options.launched_ranks_per_host)
    if training.batch_size % sharding.world_size:
        raise CompileError(
            [
                Diagnostic(
                    training.loc,
                    "training.batch_size",
                    f"global batch size {training.batch_size} does not divide evenly over {sharding.world_size} ranks",
                )
            ]
        )
    return dataclasses.replace(ir, sharding=sharding, training=training)
