"""The sharding planner's entry: ModelIR + Topology -> ShardingPlan.

    topology_from_ir   the machine: ranks, hosts, memory, bandwidths, batch per rank
    enumerate          candidate shardings per table, narrowed by the spec's constraints
    estimate           bytes and milliseconds of every shard
    partition          one candidate per table, shards on ranks under memory limits,
                       the slowest rank as fast as it can be made

Runs after validate and before lower. Each stage is a Protocol with a
default implementation; `Planner(...)` takes replacements (tests do).
Requires a validated ModelIR; guarantees that every table appears exactly
once, that its shards tile it as docs/planner.md says for its sharding type,
and that no rank is estimated to need more than its memory. The same IR and
topology always give the same plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import astuple

from compiler.diagnostics import CompileError
from compiler.ir import ModelIR
from compiler.planner.enumerate import (
    Candidate,
    Enumerator,
    ShardingEnumerator,
    ShardShape,
    TableCandidates,
    TableSpec,
)
from compiler.planner.estimate import BandwidthEstimator, Estimator
from compiler.planner.fit import fitting_hint, grown, succeeds
from compiler.planner.partition import (
    GreedyPartitioner,
    Option,
    Partitioner,
    Placement,
    TableOptions,
    check_total_memory,
    lower_bound_ms,
)
from compiler.planner.plan import RankPlan, Shard, ShardingPlan, TablePlan
from compiler.planner.topology import Topology, topology_from_ir

__all__ = ["Planner", "plan", "topology_from_ir", "inputs_sha256"]

COST_DECIMALS = 6  # plan.json keeps estimated milliseconds to the nanosecond


class Planner:
    def __init__(
        self,
        enumerator: Enumerator | None = None,
        estimator: Estimator | None = None,
        partitioner: Partitioner | None = None,
    ) -> None:
        self.enumerator = enumerator or ShardingEnumerator()
        self.estimator = estimator or BandwidthEstimator()
        self.partitioner = partitioner or GreedyPartitioner()

    def plan(self, ir: ModelIR, topology: Topology, given: ShardingPlan | None = None) -> ShardingPlan:
        """Plan `ir` for `topology`; with `given` (a plan checked by check.check_plan),
        keep its shards and ranks and only estimate them."""
        tables = self._tables(ir, topology)
        if given is None:
            try:
                placements = self._place(tables, topology)
            except CompileError as error:
                raise self._with_fitting_world_size(error, ir, topology) from None
            chosen = [(t.table, t.options[p.option], p.ranks, p.reason) for t, p in zip(tables, placements)]
        else:
            chosen = [self._given(t.table, given.table(t.table.name), topology) for t in tables]
        return _assemble(ir, topology, chosen, lower_bound_ms(tables, topology))

    def _tables(self, ir: ModelIR, topology: Topology) -> tuple[TableOptions, ...]:
        return tuple(self._options(c, topology) for c in self.enumerator.enumerate(ir, topology))

    def _place(self, tables: tuple[TableOptions, ...], topology: Topology) -> tuple[Placement, ...]:
        check_total_memory(tables, topology)
        return self.partitioner.partition(tables, topology)

    def _with_fitting_world_size(self, error: CompileError, ir: ModelIR, topology: Topology) -> CompileError:
        """`error` (no room for the tables) with the world size that would fit (compiler/planner/fit.py)."""
        batch = ir.training.batch_size

        def fits(world_size: int) -> bool:
            larger = grown(topology, world_size, batch)
            return succeeds(lambda: self._place(self._tables(ir, larger), larger))

        step = topology.ranks_per_host if topology.num_hosts > 1 else 1
        need = sum(min(o.total_storage for o in t.options) for t in self._tables(ir, topology))
        least = -(-need // topology.memory_per_rank)  # no fewer ranks can hold the bytes
        hint = fitting_hint(fits, topology.world_size, batch, step, least)
        return CompileError(dataclasses.replace(d, message=f"{d.message}; {hint}") for d in error.diagnostics)

    def _options(self, candidates: TableCandidates, topology: Topology) -> TableOptions:
        table = candidates.table
        options = tuple(Option.of(c, self.estimator.estimate(table, c, topology)) for c in candidates.candidates)
        c = candidates.constraint
        constrained = bool(c and (c.sharding_types or c.compute_kernels or c.ranks))
        return TableOptions(table, options, candidates.allowed_ranks, constrained)

    def _given(
        self, table: TableSpec, given: TablePlan, topology: Topology
    ) -> tuple[TableSpec, Option, tuple[int, ...], str]:
        shapes = tuple(ShardShape(s.row_offset, s.rows, s.col_offset, s.cols) for s in given.shards)
        ranks = tuple(s.rank for s in given.shards)
        candidate = Candidate(given.sharding_type, given.compute_kernel, shapes, ranks)
        option = Option.of(candidate, self.estimator.estimate(table, candidate, topology))
        return table, option, ranks, given.reason or "given in the plan file"


def plan(ir: ModelIR, topology: Topology, given: ShardingPlan | None = None) -> ShardingPlan:
    """The default planner's plan of `ir` for `topology` (see Planner.plan)."""
    return Planner().plan(ir, topology, given)


def _assemble(
    ir: ModelIR,
    topology: Topology,
    chosen: list[tuple[TableSpec, Option, tuple[int, ...], str]],
    bound: float,
) -> ShardingPlan:
    world = topology.world_size
    used, load = [0] * world, [0.0] * world
    tables = []
    for table, option, ranks, reason in chosen:
        for rank, storage, cost in zip(ranks, option.storage, option.cost):
            used[rank] += storage
            load[rank] += cost
        shards = tuple(
            Shard(rank=rank, row_offset=s.row_offset, rows=s.rows, col_offset=s.col_offset, cols=s.cols)
            for rank, s in zip(ranks, option.candidate.shards)
        )
        tables.append(
            TablePlan(
                table=table.name,
                sharding_type=option.candidate.sharding_type,
                compute_kernel=option.candidate.compute_kernel,
                shards=shards,
                storage_bytes=option.total_storage,
                cost_ms=round(option.total_cost, COST_DECIMALS),
                reason=reason,
            )
        )
    ranks = tuple(RankPlan(r, used[r], topology.memory_per_rank, round(load[r], COST_DECIMALS)) for r in range(world))
    return ShardingPlan(
        world_size=world,
        device=topology.device,
        inputs_sha256=inputs_sha256(ir, topology),
        tables=tuple(tables),
        ranks=ranks,
        lower_bound_ms=round(bound, COST_DECIMALS),
    )


def inputs_text(ir: ModelIR, topology: Topology) -> str:
    """The canonical text of everything a plan depends on: the topology, the batch,
    the tables, their features' ids and the constraints."""
    lines = [
        "reccompile plan inputs 1",
        "topology " + " ".join(repr(v) for v in astuple(topology)),
        f"batch_size {ir.training.batch_size}",
    ]
    for table in ir.tables:
        lines.append(f"table {table.name} {table.num_embeddings} {table.dim} {table.pooling} {table.optimizer.type}")
    for feature in ir.sparse:
        sequence = f" max_length {feature.max_length}" if feature.is_sequence else ""
        lines.append(
            f"feature {feature.name} {feature.table} {feature.ids_per_sample} "
            f"{feature.fixed_ids} {feature.weighted}{sequence}"
        )
    for c in ir.sharding.constraints:
        lines.append(f"constraint {c.table} {list(c.sharding_types)} {list(c.compute_kernels)} {list(c.ranks)}")
    return "\n".join(lines) + "\n"


def inputs_sha256(ir: ModelIR, topology: Topology) -> str:
    return hashlib.sha256(inputs_text(ir, topology).encode()).hexdigest()
