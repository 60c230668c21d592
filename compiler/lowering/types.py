"""The data the lowering passes hand each other: plain frozen values, no logic.

    lower              -> LoweredModel   the fx graph and the submodule declarations
    check_shapes       -> LoweredModel   the same, with node.meta["shape"] filled in
    check_dense_memory -> LoweredModel   the same, once the replicated blocks fit beside the tables
    split_stages       -> SplitModel     the LoweredModel and its two pipeline stages

Kept apart from the passes so that each pass imports the types, never another
pass: `split` returns a new type instead of filling in a field of `lower`'s,
and the order of the passes is checked by the types (`emit` takes a
SplitModel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from compiler.ir import Location, ModelIR
from compiler.planner.plan import ShardingPlan


@dataclass(frozen=True, slots=True)
class BuildArg:
    """A value supplied when the model is built (`plan`, `process_group`, `device`)."""

    name: str


@dataclass(frozen=True, slots=True)
class Call:
    """A call of a runtime factory with literal (or `Call`/`BuildArg`) arguments."""

    factory: str  # dotted path, e.g. "runtime.modules.blocks.pooled.MLP"
    kwargs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class ModuleDecl:
    """A submodule of the model: `self.<target> = <call>`."""

    target: str
    call: Call
    loc: Location


@dataclass(frozen=True)
class LoweredModel:
    """The distributed program of `ir` under `plan`: its fx graph and its submodules."""

    ir: ModelIR
    plan: ShardingPlan
    modules: tuple[ModuleDecl, ...]
    graph: fx.Graph = field(compare=False)


@dataclass(frozen=True)
class StageGraphs:
    """The graph cut at the pipeline boundary (see split.py)."""

    input_dist: fx.Graph  # stage 0
    compute: fx.Graph  # stage 1
    forward: fx.Graph  # both, in sequence
    cut: tuple[str, ...]  # the values stage 0 hands to stage 1, in order


@dataclass(frozen=True)
class SplitModel(LoweredModel):
    """A LoweredModel with its pipeline stages: what code generation takes."""

    stages: StageGraphs = field(compare=False, kw_only=True)
