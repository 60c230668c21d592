"""Checking a given plan against the spec and the topology (`--plan FILE`).

Runs where the planner would: after validate, before lower. A plan passes
when it is for this world size and device, covers every table of the spec
exactly once, lays each table's shards out as its sharding type requires
(docs/planner.md, "Shard layouts"), shards no sequence table table_row_wise
and no rowwise_adagrad table column_wise unless the spec asks for it,
respects the spec's constraints and
fits every rank's memory under the planner's own storage estimate. Every
problem is reported, at the plan file's line and column and with its JSON
path, the way spec diagnostics are.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Callable

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import Constraint, Location, ModelIR
from compiler.planner.enumerate import (
    COLUMN_BLOCK,
    Candidate,
    ShardShape,
    TableSpec,
    row_splits,
    sequence_row_wise_message,
    table_specs,
)
from compiler.planner.estimate import BandwidthEstimator
from compiler.planner.plan import ShardingPlan, TablePlan
from compiler.planner.plan_file import read_plan_file
from compiler.planner.planner import plan
from compiler.planner.topology import Topology, format_bytes
from runtime.sharding.types import FUSED_DIM_MULTIPLE, kernel_fits

Problems = list[tuple[str, str]]  # (JSON path, message)


def read_plan(path: Path | str, ir: ModelIR, topology: Topology) -> ShardingPlan:
    """The plan in `path`, checked against `ir` and `topology`, with fresh estimates."""
    given, plan_file = read_plan_file(path)
    check_plan(ir, topology, given, plan_file.locate)
    return plan(ir, topology, given)


def check_plan(
    ir: ModelIR,
    topology: Topology,
    plan: ShardingPlan,
    locate: Callable[[str], Location] | None = None,
) -> None:
    """Raise CompileError with every way `plan` does not fit `ir` on `topology`.

    `locate` maps a JSON path to its place in the plan file; without it every
    diagnostic is placed at line 1, column 1 of `<plan>`.
    """
    locate = locate or (lambda _: Location("<plan>", 1, 1))
    problems: Problems = []
    if plan.world_size != topology.world_size:
        problems.append(
            ("world_size", f"the plan is for world size {plan.world_size}, this compile for {topology.world_size}")
        )
    if plan.device and plan.device != topology.device:
        problems.append(("device", f"the plan is for device {plan.device}, this compile for {topology.device}"))
    if problems:  # every shard would be reported too: say only this
        raise CompileError(Diagnostic(locate(p), p, m) for p, m in problems)
    specs = {t.name: t for t in table_specs(ir)}
    constraints = {c.table: c for c in ir.sharding.constraints}
    first: dict[str, int] = {}
    for i, table_plan in enumerate(plan.tables):
        path, name = f"tables[{i}]", table_plan.table
        if name not in specs:
            close = difflib.get_close_matches(name, specs, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append((f"{path}.table", f"no table named '{name}' in the spec{hint}"))
        elif name in first:
            problems.append((f"{path}.table", f"table '{name}' appears again (first at tables[{first[name]}])"))
        else:
            first[name] = i
            problems += _check_table(specs[name], table_plan, path, topology, constraints.get(name))
    problems += [("tables", f"table '{name}' is missing from the plan") for name in specs if name not in first]
    if not problems:
        problems += _check_memory(plan, specs, topology)
    if problems:
        raise CompileError(Diagnostic(locate(p), p, m) for p, m in problems)


def _check_table(
    table: TableSpec, given: TablePlan, path: str, topology: Topology, constraint: Constraint | None
) -> Problems:
    """Kernel, constraints and ranks of one table, then its layout."""
    problems: Problems = []
    kind, kernel = given.sharding_type, given.compute_kernel
    only = f"for '{table.name}'"
    if not kernel_fits(kernel, table.dim):  # column shards: _check_columns wants multiples of 4
        problems.append(
            (
                f"{path}.compute_kernel",
                f"the {kernel} kernel needs a dim that is a multiple of {FUSED_DIM_MULTIPLE}, "
                f"'{table.name}' has {table.dim}; use the dense kernel",
            )
        )
    asked = constraint is not None and "column_wise" in constraint.sharding_types
    if kind == "column_wise" and table.optimizer == "rowwise_adagrad" and len(given.shards) > 1 and not asked:
        problems.append(
            (
                f"{path}.sharding_type",
                f"column_wise shards of '{table.name}' would each keep their own rowwise_adagrad accumulator, so "
                "the ranks would not train what one process trains; the spec's constraints must ask for column_wise "
                "(sharding_types) to allow it",
            )
        )
    if kind == "table_row_wise" and table.is_sequence:
        problems.append((f"{path}.sharding_type", sequence_row_wise_message(table.name, table.sequence_features)))
    if constraint is not None and constraint.sharding_types and kind not in constraint.sharding_types:
        allowed = ", ".join(constraint.sharding_types)
        problems.append((f"{path}.sharding_type", f"the spec's constraints allow only {allowed} {only}"))
    if constraint is not None and constraint.compute_kernels and kernel not in constraint.compute_kernels:
        allowed = ", ".join(constraint.compute_kernels)
        problems.append((f"{path}.compute_kernel", f"the spec's constraints allow only {allowed} {only}"))
    for j, shard in enumerate(given.shards):
        where = f"{path}.shards[{j}].rank"
        if shard.rank >= topology.world_size:
            problems.append((where, f"rank {shard.rank} is out of range for world size {topology.world_size}"))
        elif constraint is not None and constraint.ranks and shard.rank not in constraint.ranks:
            allowed = ", ".join(map(str, constraint.ranks))
            problems.append((where, f"the spec's constraints allow only ranks {allowed} {only}"))
    return problems + _check_layout(table, given, path, topology)


def _check_layout(table: TableSpec, given: TablePlan, path: str, topology: Topology) -> Problems:
    """The shards against the layout their sharding type prescribes (docs/planner.md)."""
    kind, shards = given.sharding_type, given.shards
    world, per_host = topology.world_size, topology.ranks_per_host
    if kind == "column_wise":
        return _check_columns(table, given, path)
    whole = (0, table.rows, 0, table.dim)
    if kind == "table_wise":
        expected: list[tuple[int | None, tuple[int, int, int, int]]] = [(None, whole)]
    elif kind == "data_parallel":
        expected = [(rank, whole) for rank in range(world)]
    else:
        host = shards[0].rank // per_host if kind == "table_row_wise" and shards[0].rank < world else 0
        ranks = topology.host_ranks(host) if kind == "table_row_wise" else tuple(range(world))
        splits = row_splits(table.rows, len(ranks))
        expected = [(rank, (offset, rows, 0, table.dim)) for rank, (offset, rows) in zip(ranks, splits)]
    if len(shards) != len(expected):
        layout = {
            "table_wise": "one shard",
            "data_parallel": f"one replica per rank ({world})",
            "row_wise": f"one row block per rank ({world})",
            "table_row_wise": f"one row block per rank of a host ({per_host})",
        }[kind]
        return [(f"{path}.shards", f"{kind} has {layout}, got {len(shards)} shards")]
    problems: Problems = []
    for j, (shard, (rank, want)) in enumerate(zip(shards, expected)):
        got = (shard.row_offset, shard.rows, shard.col_offset, shard.cols)
        if got != want:
            field = ("row_offset", "rows", "col_offset", "cols")[next(k for k in range(4) if got[k] != want[k])]
            problems.append(
                (
                    f"{path}.shards[{j}].{field}",
                    f"{kind} shard {j} of '{table.name}' must be {_area(*want)}, got {_area(*got)}",
                )
            )
        if rank is not None and shard.rank != rank and shard.rank < world:
            where = f"host {rank // per_host}, " if kind == "table_row_wise" else ""
            problems.append(
                (
                    f"{path}.shards[{j}].rank",
                    f"{kind} shard {j} of '{table.name}' belongs on {where}rank {rank}, got {shard.rank}",
                )
            )
    return problems


def _area(row_offset: int, rows: int, col_offset: int, cols: int) -> str:
    return f"rows {row_offset}..{row_offset + rows} x cols {col_offset}..{col_offset + cols}"


def _check_columns(table: TableSpec, given: TablePlan, path: str) -> Problems:
    """column_wise: full-height shards tiling the columns in order, widths multiples of
    COLUMN_BLOCK, each on a rank of its own."""
    problems: Problems = []
    end = 0
    holder: dict[int, int] = {}  # rank -> the first shard on it
    for j, shard in enumerate(given.shards):
        where = f"{path}.shards[{j}]"
        if shard.rank in holder:
            problems.append(
                (
                    f"{where}.rank",
                    f"column_wise shards {holder[shard.rank]} and {j} of '{table.name}' are both on rank "
                    f"{shard.rank}; a rank holds one shard of a table",
                )
            )
        holder.setdefault(shard.rank, j)
        if (shard.row_offset, shard.rows) != (0, table.rows):
            problems.append(
                (
                    f"{where}.row_offset" if shard.row_offset else f"{where}.rows",
                    f"column_wise shards hold all {table.rows} rows of '{table.name}', "
                    f"got rows {shard.row_offset}..{shard.row_offset + shard.rows}",
                )
            )
        if shard.col_offset != end:
            problems.append(
                (
                    f"{where}.col_offset",
                    f"column_wise shard {j} of '{table.name}' must start at column {end}, got {shard.col_offset}",
                )
            )
        if shard.cols % COLUMN_BLOCK:
            problems.append(
                (f"{where}.cols", f"column_wise shard widths are multiples of {COLUMN_BLOCK}, got {shard.cols}")
            )
        end = shard.col_offset + shard.cols
    if end != table.dim and not problems:
        problems.append(
            (f"{path}.shards", f"column_wise shards of '{table.name}' end at column {end}, the table has {table.dim}")
        )
    return problems


def _check_memory(plan: ShardingPlan, specs: dict[str, TableSpec], topology: Topology) -> Problems:
    """Each rank's estimated bytes against its memory; reported at the rank's largest shard."""
    estimator = BandwidthEstimator()
    used = [0] * topology.world_size
    largest: dict[int, tuple[int, str, str]] = {}  # rank -> (bytes, JSON path, table)
    for i, given in enumerate(plan.tables):
        shapes = tuple(ShardShape(s.row_offset, s.rows, s.col_offset, s.cols) for s in given.shards)
        candidate = Candidate(given.sharding_type, given.compute_kernel, shapes, None)
        estimates = estimator.estimate(specs[given.table], candidate, topology)
        for j, (shard, estimate) in enumerate(zip(given.shards, estimates)):
            used[shard.rank] += estimate.storage_bytes
            if estimate.storage_bytes > largest.get(shard.rank, (-1, "", ""))[0]:
                largest[shard.rank] = (estimate.storage_bytes, f"tables[{i}].shards[{j}]", given.table)
    cap = topology.memory_per_rank
    return [
        (
            largest[rank][1],
            f"rank {rank} would hold {format_bytes(used[rank])}, more than its {format_bytes(cap)} "
            f"(this shard of '{largest[rank][2]}': {format_bytes(largest[rank][0])})",
        )
        for rank in range(topology.world_size)
        if used[rank] > cap
    ]
