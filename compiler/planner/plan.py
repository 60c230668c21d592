"""The ShardingPlan: where every table's shards live, and why.

The planner produces it, the lowering reads it, and the generated module
carries it as the plain dict of `to_dict()` (the runtime never imports the
compiler, so the dict form is the contract with `runtime.sharding`). The JSON
form is versioned and records the sha256 of the inputs it was planned from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from compiler.ir import ComputeKernel, ShardingType

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Shard:
    """A block of a table: rows [row_offset, row_offset+rows) x cols [col_offset, col_offset+cols)."""

    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int


@dataclass(frozen=True, slots=True)
class TablePlan:
    table: str
    sharding_type: ShardingType
    compute_kernel: ComputeKernel
    shards: tuple[Shard, ...]  # data_parallel: one full replica per rank
    storage_bytes: int  # estimated, all shards together
    cost_ms: float  # estimated per step, all shards together
    reason: str


@dataclass(frozen=True, slots=True)
class RankPlan:
    rank: int
    bytes_used: int
    bytes_available: int
    cost_ms: float


@dataclass(frozen=True, slots=True)
class ShardingPlan:
    world_size: int
    device: str
    inputs_sha256: str
    tables: tuple[TablePlan, ...]
    ranks: tuple[RankPlan, ...]
    # No plan of the enumerated options has a slowest rank below this (0: unknown).
    lower_bound_ms: float = 0.0

    def table(self, name: str) -> TablePlan:
        for table in self.tables:
            if table.table == name:
                return table
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, not tuples): the form generated modules and plan.json hold."""
        data = asdict(self)
        return {"format_version": FORMAT_VERSION, **json.loads(json.dumps(data))}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardingPlan:
        """Inverse of `to_dict`; raises KeyError/TypeError/ValueError on malformed data
        (the plan-file checker turns those into diagnostics)."""
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"unsupported plan format_version {data.get('format_version')!r} (this compiler reads {FORMAT_VERSION})"
            )
        tables = tuple(
            TablePlan(
                table=t["table"],
                sharding_type=t["sharding_type"],
                compute_kernel=t["compute_kernel"],
                shards=tuple(Shard(**s) for s in t["shards"]),
                storage_bytes=int(t["storage_bytes"]),
                cost_ms=float(t["cost_ms"]),
                reason=t["reason"],
            )
            for t in data["tables"]
        )
        ranks = tuple(RankPlan(**r) for r in data["ranks"])
        return cls(
            world_size=int(data["world_size"]),
            device=data["device"],
            inputs_sha256=data["inputs_sha256"],
            tables=tables,
            ranks=ranks,
            lower_bound_ms=float(data.get("lower_bound_ms", 0.0)),
        )

    @classmethod
    def from_json(cls, text: str) -> ShardingPlan:
        return cls.from_dict(json.loads(text))
