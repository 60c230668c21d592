"""The printed form of a plan (`reccompile plan`): one row per table, one per rank, then the balance.

Reads only the ShardingPlan and the Topology it was made for; the text is
deterministic, so tests compare it against golden files.
"""

from __future__ import annotations

from typing import Sequence

from compiler.ir import ModelIR
from compiler.planner.plan import ShardingPlan
from compiler.planner.topology import Topology, format_bytes


def format_plan(ir: ModelIR, topology: Topology, plan: ShardingPlan) -> str:
    """The plan of `ir` as text: header, tables, ranks, imbalance and lower bound."""
    table_rows = [("table", "rows × dim", "sharding", "kernel", "ranks", "est. bytes", "est. ms", "reason")]
    for table in plan.tables:
        rows = max(s.row_offset + s.rows for s in table.shards)
        dim = max(s.col_offset + s.cols for s in table.shards)
        table_rows.append(
            (
                table.table,
                f"{rows} × {dim}",
                table.sharding_type,
                table.compute_kernel,
                rank_ranges(sorted({s.rank for s in table.shards})),
                format_bytes(table.storage_bytes),
                f"{table.cost_ms:.3f}",
                table.reason.removeprefix(f"{table.sharding_type}: "),
            )
        )
    rank_rows = [("rank", "bytes used / available", "est. ms")]
    for rank in plan.ranks:
        share = rank.bytes_used / rank.bytes_available
        rank_rows.append(
            (
                str(rank.rank),
                f"{format_bytes(rank.bytes_used)} / {format_bytes(rank.bytes_available)} ({share:.0%})",
                f"{rank.cost_ms:.3f}",
            )
        )
    loads = [r.cost_ms for r in plan.ranks]
    slowest, mean = max(loads), sum(loads) / len(loads)
    tables = f"{len(plan.tables)} table" + ("s" if len(plan.tables) != 1 else "")
    lines = [f"plan for {ir.name}: {tables} on {topology.describe()}", ""]
    lines += _columns(table_rows, right={1, 5, 6})
    lines.append("")
    lines += _columns(rank_rows, right={1, 2})
    lines.append("")
    lines.append(f"imbalance (slowest / mean rank): {slowest / mean if mean else 1.0:.3f}")
    bound = plan.lower_bound_ms
    gap = f" (slowest rank {slowest:.3f} ms, {slowest / bound - 1:+.1%})" if bound else ""
    lines.append(f"lower bound (least total estimated time / world size): {bound:.3f} ms{gap}")
    return "\n".join(lines) + "\n"


def rank_ranges(ranks: Sequence[int]) -> str:
    """Sorted ranks as ranges: [0, 1, 2, 5] -> `0-2,5`."""
    parts: list[str] = []
    start = prev = None
    for rank in [*ranks, None]:
        if prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = rank
    return ",".join(parts)


def _columns(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """Rows padded into columns two spaces apart; columns in `right` align right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out
