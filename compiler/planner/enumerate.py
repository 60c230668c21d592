"""Enumerate: the ways each table may be sharded, narrowed by the spec's constraints.

Second stage of the planner, after topology and before estimate. For every
table it lists `Candidate`s: a sharding type, a compute kernel and the shard
shapes, with fixed ranks where the sharding type decides them (data_parallel,
row_wise, table_row_wise) or none where the partitioner places each shard
(table_wise, column_wise). A constraint that leaves a table no candidate, or
names a table, rank or kernel that does not exist, is a CompileError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import Constraint, Location, ModelIR, OptimizerType
from compiler.planner.topology import Topology
from runtime.sharding.types import (
    FUSED_DIM_MULTIPLE,
    SHARDING_TYPES,
    ComputeKernel,
    ShardingType,
    kernel_fits,
)

COLUMN_BLOCK = FUSED_DIM_MULTIPLE  # column_wise shard widths are multiples of this, so any kernel fits


@dataclass(frozen=True, slots=True)
class TableSpec:
    """What the planner needs to know of one table, gathered from its features."""

    index: int  # position in ModelIR.tables
    name: str
    rows: int
    dim: int
    ids_per_sample: int  # all its features together (the maximum where not fixed; max_length of a sequence)
    outputs_per_sample: int  # vectors out per sample: one per feature, or one row per id (sequence)
    weighted: bool  # some feature carries per-id weights
    optimizer: OptimizerType
    loc: Location
    sequence_features: tuple[str, ...] = ()  # non-empty: a sequence table, looked up as rows

    @property
    def is_sequence(self) -> bool:
        return bool(self.sequence_features)


class ShardShape(NamedTuple):
    """Rows [row_offset, row_offset+rows) x cols [col_offset, col_offset+cols).

    A NamedTuple rather than a dataclass: large plans make hundreds of
    thousands of these.
    """

    row_offset: int
    rows: int
    col_offset: int
    cols: int


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to shard a table. `ranks` is None when the partitioner places each shard."""

    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    shards: tuple[ShardShape, ...]
    ranks: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class TableCandidates:
    table: TableSpec
    candidates: tuple[Candidate, ...]
    allowed_ranks: tuple[int, ...]  # where free shards may go
    constraint: Constraint | None


class Enumerator(Protocol):
    def enumerate(self, ir: ModelIR, topology: Topology) -> tuple[TableCandidates, ...]: ...


def table_specs(ir: ModelIR) -> tuple[TableSpec, ...]:
    """The planner's view of `ir.tables`, in order."""
    features: dict[str, list] = {}
    for feature in ir.sparse:
        features.setdefault(feature.table, []).append(feature)
    specs = []
    for index, table in enumerate(ir.tables):
        own = features.get(table.name, [])
        optimizer = table.optimizer
        ids = sum(f.max_length if f.is_sequence else f.ids_per_sample for f in own)
        sequences = tuple(f.name for f in own if f.is_sequence or f.position_weighted)  # looked up as rows
        specs.append(
            TableSpec(
                index=index,
                name=table.name,
                rows=table.num_embeddings,
                dim=table.dim,
                ids_per_sample=ids,
                # A sequence table returns every id's row, its pooled features' too.
                outputs_per_sample=ids if sequences else max(1, len(own)),
                weighted=any(f.weighted for f in own),
                optimizer=optimizer.type,
                loc=table.loc,
                sequence_features=sequences,
            )
        )
    return tuple(specs)


def row_splits(rows: int, parts: int) -> tuple[tuple[int, int], ...]:
    """(offset, rows) of `parts` row blocks of ceil(rows/parts); the last ones may be short or empty."""
    block = -(-rows // parts)
    return tuple((min(i * block, rows), max(0, min(block, rows - i * block))) for i in range(parts))


def column_splits(dim: int, parts: int) -> tuple[tuple[int, int], ...]:
    """(offset, cols) of `parts` column blocks, multiples of COLUMN_BLOCK, widest first."""
    units, extra = divmod(dim // COLUMN_BLOCK, parts)
    widths = [(units + (1 if i < extra else 0)) * COLUMN_BLOCK for i in range(parts)]
    offsets = [sum(widths[:i]) for i in range(parts)]
    return tuple(zip(offsets, widths))


def column_wise_parts(dim: int, ranks: int) -> tuple[int, ...]:
    """Shard counts tried for column_wise over `ranks` usable ranks: powers of two up to
    the ranks and dim/4, since no rank holds two shards of a table; a single shard when
    only one rank is usable (world size 1)."""
    if dim % COLUMN_BLOCK:
        return ()
    if ranks == 1:
        return (1,)
    limit = min(ranks, dim // COLUMN_BLOCK)
    return tuple(2**i for i in range(1, int(math.log2(limit)) + 1)) if limit >= 2 else ()


class ShardingEnumerator:
    """Every sharding type and kernel the constraints allow, with these defaults:

    kernel `fused`, or `dense` for a table whose dim fbgemm's fused kernel
    cannot hold (not a multiple of 4); at world size 1 only table_wise;
    table_row_wise only with more than one host (on one host it is row_wise),
    and never for a sequence table (the runtime does not build it);
    column_wise in 2, 4, 8 ... shards, one per rank, and not for
    rowwise_adagrad tables (each shard would keep its own row accumulator).
    A kernel the runtime cannot build for a table is never a candidate.
    """

    def enumerate(self, ir: ModelIR, topology: Topology) -> tuple[TableCandidates, ...]:
        constraints = _check_constraints(ir, topology)
        result, problems = [], []
        for table in table_specs(ir):
            constraint = constraints.get(table.name)
            candidates = self._candidates(table, constraint, topology)
            if not candidates:
                problems.append(_no_candidate(table, constraint, topology))
            allowed = constraint.ranks if constraint and constraint.ranks else tuple(range(topology.world_size))
            result.append(TableCandidates(table, candidates, tuple(sorted(set(allowed))), constraint))
        if problems:
            raise CompileError(problems)
        return tuple(result)

    def _candidates(self, table: TableSpec, constraint: Constraint | None, topology: Topology) -> tuple[Candidate, ...]:
        world = topology.world_size
        types = constraint.sharding_types if constraint and constraint.sharding_types else None
        if constraint and constraint.compute_kernels:
            kernels = tuple(k for k in constraint.compute_kernels if kernel_fits(k, table.dim))
        else:
            kernels = ("fused",) if kernel_fits("fused", table.dim) else ("dense",)
        if types is None:
            types = ("table_wise",) if world == 1 else SHARDING_TYPES
            if topology.num_hosts == 1 or table.is_sequence:
                types = tuple(t for t in types if t != "table_row_wise")
            if table.optimizer == "rowwise_adagrad":
                # Each column shard would keep its own per-row accumulator, so
                # training would no longer equal one process; only on request.
                types = tuple(t for t in types if t != "column_wise")
        all_ranks = tuple(range(world))
        allowed = set(constraint.ranks) if constraint and constraint.ranks else set(all_ranks)
        full = ShardShape(0, table.rows, 0, table.dim)
        out = []
        for kernel in kernels:
            for sharding_type in SHARDING_TYPES:
                if sharding_type not in types:
                    continue
                if sharding_type == "table_wise":
                    out.append(Candidate("table_wise", kernel, (full,), None))
                elif sharding_type == "column_wise":
                    for parts in column_wise_parts(table.dim, len(allowed)):
                        shards = tuple(ShardShape(0, table.rows, o, c) for o, c in column_splits(table.dim, parts))
                        out.append(Candidate("column_wise", kernel, shards, None))
                elif sharding_type == "row_wise" and allowed.issuperset(all_ranks):
                    shards = tuple(ShardShape(o, r, 0, table.dim) for o, r in row_splits(table.rows, world))
                    out.append(Candidate("row_wise", kernel, shards, all_ranks))
                elif sharding_type == "table_row_wise":
                    splits = row_splits(table.rows, topology.ranks_per_host)
                    shards = tuple(ShardShape(o, r, 0, table.dim) for o, r in splits)
                    for host in range(topology.num_hosts):
                        ranks = topology.host_ranks(host)
                        if allowed.issuperset(ranks):
                            out.append(Candidate("table_row_wise", kernel, shards, ranks))
                elif sharding_type == "data_parallel" and allowed.issuperset(all_ranks):
                    out.append(Candidate("data_parallel", kernel, (full,) * world, all_ranks))
        return tuple(out)


def _check_constraints(ir: ModelIR, topology: Topology) -> dict[str, Constraint]:
    """Constraints by table; unknown tables, ranks outside the world and table_row_wise
    for a sequence table are errors."""
    names = {t.name for t in ir.tables}
    sequences = {t.name: t.sequence_features for t in table_specs(ir) if t.is_sequence}
    problems, by_table = [], {}
    for constraint in ir.sharding.constraints:
        path = f"sharding.constraints.{constraint.table}"
        if constraint.table not in names:
            problems.append(Diagnostic(constraint.loc, path, f"no table named '{constraint.table}'"))
            continue
        if constraint.table in sequences and "table_row_wise" in constraint.sharding_types:
            problems.append(
                Diagnostic(
                    constraint.loc,
                    f"{path}.sharding_types",
                    sequence_row_wise_message(constraint.table, sequences[constraint.table]),
                )
            )
        bad_ranks = [r for r in constraint.ranks if not 0 <= r < topology.world_size]
        if bad_ranks:
            problems.append(
                Diagnostic(
                    constraint.loc,
                    f"{path}.ranks",
                    f"rank {bad_ranks[0]} is out of range for world size {topology.world_size}",
                )
            )
        by_table[constraint.table] = constraint
    if problems:
        raise CompileError(problems)
    return by_table


def sequence_row_wise_message(table: str, features: tuple[str, ...]) -> str:
    """Why a table looked up as rows (a sequence or position-weighted feature's) cannot be table_row_wise."""
    return (
        f"table '{table}' serves {', '.join(features)}, looked up row by row (a sequence or position-weighted "
        "feature), and such tables cannot be table_row_wise; use row_wise, table_wise, column_wise or data_parallel"
    )


def _no_candidate(table: TableSpec, constraint: Constraint | None, topology: Topology) -> Diagnostic:
    """Why the constraint on `table` rules out every sharding (each allowed type's reason)."""
    assert constraint is not None  # unconstrained tables always have table_wise
    if not any(kernel_fits(k, table.dim) for k in constraint.compute_kernels or ("dense",)):
        return Diagnostic(
            constraint.loc,
            f"sharding.constraints.{table.name}.compute_kernels",
            f"table '{table.name}' has dim {table.dim}, which the fused kernel cannot hold "
            f"(it needs a multiple of {FUSED_DIM_MULTIPLE}); allow the dense kernel",
        )
    reasons = []
    ranks = ", ".join(map(str, constraint.ranks))
    for sharding_type in constraint.sharding_types:
        if sharding_type == "column_wise":
            reasons.append(
                f"column_wise needs a dim that is a multiple of {COLUMN_BLOCK} and at least "
                f"{2 * COLUMN_BLOCK} (got {table.dim}), one rank per shard"
            )
        elif sharding_type == "table_row_wise":
            reasons.append(f"table_row_wise needs every rank of a host, the constraint allows only ranks {ranks}")
        else:
            reasons.append(
                f"{sharding_type} needs all {topology.world_size} ranks, the constraint allows only ranks {ranks}"
            )
    return Diagnostic(
        constraint.loc,
        f"sharding.constraints.{table.name}",
        f"no way to shard table '{table.name}' is left: " + "; ".join(reasons),
    )
