"""Where each table's shards live: the plan dict read into typed layouts.

SparseArch reads the plan's `tables` entries here (the dict of the
compiler's `ShardingPlan.to_dict()`; the runtime never imports the compiler),
checks them against the table configs and the rules of each sharding type,
and hands every group the `TableLayout`s of its tables. From those layouts
each rank derives, without communicating, the same routing: which rank looks
up which `Slot` (one feature's ids in one shard), in which order, and which
sub-table (`LocalTable`) each rank builds for each of its shards.

Slot order on a rank, which both ends of every all-to-all rely on: compute
kernel (in order of first appearance in the group), then table order, then
shard order (row offset, then column offset), then the table's features.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingConfig
from runtime.sharding.types import ROW_SHARDED, SHARDING_TYPES

TableConfig = EmbeddingBagConfig | EmbeddingConfig  # a bag table, or a sequence table (rows per id)


@dataclass(frozen=True, slots=True)
class Shard:
    """Rows [row_offset, row_offset + rows) x columns [col_offset, col_offset + cols), on `rank`."""

    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int


@dataclass(frozen=True, slots=True)
class TableLayout:
    """One table, its sharding type and compute kernel, and its shards sorted by offset."""

    config: TableConfig
    sharding_type: str
    kernel: str
    shards: tuple[Shard, ...]

    def is_whole(self, shard: Shard) -> bool:
        return shard.rows == self.config.num_embeddings and shard.cols == self.config.embedding_dim

    def shard_name(self, shard: Shard) -> str:
        """The table's name for a whole table, else the name plus the block held."""
        if self.is_whole(shard):
            return self.config.name
        rows = f"rows_{shard.row_offset}_{shard.row_offset + shard.rows}"
        return f"{self.config.name}.{rows}.cols_{shard.col_offset}_{shard.col_offset + shard.cols}"

    def slot_name(self, feature: str, shard: Shard) -> str:
        """The key under which the owner of `shard` receives `feature`'s ids."""
        return feature if self.is_whole(shard) else f"{feature}@{self.shard_name(shard)}"

    def gathers_from(self, shard: Shard) -> bool:
        """Whether `shard` supplies its block of the full table (one replica of data_parallel)."""
        return self.sharding_type != "data_parallel" or shard == self.shards[0]


@dataclass(frozen=True, slots=True)
class LocalTable:
    """A shard as its owner builds it: a sub-table looked up under slot names."""

    layout: TableLayout
    shard: Shard
    config: TableConfig


@dataclass(frozen=True, slots=True)
class Slot:
    """One feature's ids looked up in one shard: the unit the id all-to-all moves."""

    key_index: int  # the feature's position among the group's output keys
    feature: str
    layout: TableLayout
    shard: Shard
    name: str


def table_layouts(tables: Sequence[TableConfig], plan: Mapping[str, Any], world_size: int) -> list[TableLayout]:
    """The layout of every table, in table order; ValueError naming the table if the plan is bad."""
    entries = {entry["table"]: entry for entry in plan["tables"]}
    missing = [t.name for t in tables if t.name not in entries]
    if missing:
        raise ValueError(f"the plan has no entry for table(s) {', '.join(missing)}")
    layouts = []
    for table in tables:
        entry = entries[table.name]
        shards = tuple(
            sorted(
                (Shard(**{f.name: int(s[f.name]) for f in fields(Shard)}) for s in entry["shards"]),
                # Empty ranges before the range starting at the same offset: bucket order.
                key=lambda s: (s.row_offset, s.col_offset, s.rows, s.cols, s.rank),
            )
        )
        layout = TableLayout(table, entry["sharding_type"], entry["compute_kernel"], shards)
        _check_layout(layout, world_size)
        layouts.append(layout)
    return layouts


def _check_layout(layout: TableLayout, world_size: int) -> None:
    kind = layout.sharding_type
    rows, dim = layout.config.num_embeddings, layout.config.embedding_dim
    where = f"plan for table {layout.config.name!r} ({kind})"
    if kind not in SHARDING_TYPES:
        raise ValueError(f"{where}: unknown sharding type; expected one of {', '.join(SHARDING_TYPES)}")
    shards = layout.shards
    if not shards:
        raise ValueError(f"{where}: no shards")
    for s in shards:
        if not 0 <= s.rank < world_size:
            raise ValueError(f"{where}: shard on rank {s.rank} but the plan has {world_size} ranks")
    ranks = [s.rank for s in shards]
    if kind == "data_parallel":
        if sorted(ranks) != list(range(world_size)) or not all(map(layout.is_whole, shards)):
            raise ValueError(f"{where}: needs one whole replica on each of the {world_size} ranks")
    elif kind == "table_wise":
        if len(shards) != 1 or not layout.is_whole(shards[0]):
            raise ValueError(f"{where}: needs exactly one shard holding the whole table")
    elif kind == "column_wise":
        _check_tiling(where, "columns", [(s.col_offset, s.cols) for s in shards], dim)
        if any(s.row_offset != 0 or s.rows != rows for s in shards):
            raise ValueError(f"{where}: every shard must hold all {rows} rows")
    else:
        _check_tiling(where, "rows", [(s.row_offset, s.rows) for s in shards], rows)
        if any(s.col_offset != 0 or s.cols != dim for s in shards):
            raise ValueError(f"{where}: every shard must hold all {dim} columns")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{where}: two row ranges on one rank")


def _check_tiling(where: str, what: str, ranges: list[tuple[int, int]], total: int) -> None:
    """(offset, size) ranges, sorted by offset, cover [0, total) without gaps or overlaps."""
    end = 0
    for offset, size in sorted(ranges):
        if offset != end or size < 0:
            raise ValueError(
                f"{where}: shards must cover {what} 0..{total} without gaps or overlaps, "
                f"found {offset}+{size} after {end}"
            )
        end = offset + size
    if end != total:
        raise ValueError(f"{where}: shards cover {what} 0..{end} of {total}")


def group_keys(tables: Sequence[TableLayout]) -> tuple[list[str], list[int]]:
    """The group's output keys (table order, then feature order) and their widths."""
    keys = [f for t in tables for f in t.config.feature_names]
    dims = [t.config.embedding_dim for t in tables for _ in t.config.feature_names]
    return keys, dims


def local_tables(tables: Sequence[TableLayout], rank: int) -> list[LocalTable]:
    """The sub-tables `rank` builds, in slot order; row-sharded ones pool by sum.

    Row-sharded shards hold part of each bag, so they return partial sums and
    the receiver divides mean bags by their full length. Empty shards (a
    row_wise table with fewer rows than ranks) receive no ids and are not built.
    """
    kernels = list(dict.fromkeys(t.kernel for t in tables))
    built = []
    for kernel in kernels:
        for layout in (t for t in tables if t.kernel == kernel):
            for shard in layout.shards:
                if shard.rank == rank and shard.rows > 0:
                    built.append(LocalTable(layout, shard, _shard_config(layout, shard)))
    return built


def _shard_config(layout: TableLayout, shard: Shard) -> TableConfig:
    table = layout.config
    low, high = table.init_range()
    if isinstance(table, EmbeddingConfig):
        return EmbeddingConfig(
            name=layout.shard_name(shard),
            num_embeddings=shard.rows,
            embedding_dim=shard.cols,
            feature_names=tuple(layout.slot_name(f, shard) for f in table.feature_names),
            weight_init_min=low,
            weight_init_max=high,
            optimizer=table.optimizer,
            where=table.where,
        )
    return EmbeddingBagConfig(
        name=layout.shard_name(shard),
        num_embeddings=shard.rows,
        embedding_dim=shard.cols,
        feature_names=tuple(layout.slot_name(f, shard) for f in table.feature_names),
        pooling="sum" if layout.sharding_type in ROW_SHARDED else table.pooling,
        weight_init_min=low,
        weight_init_max=high,
        optimizer=table.optimizer,
        where=table.where,
    )


def slots_by_rank(tables: Sequence[TableLayout], world_size: int) -> list[list[Slot]]:
    """Every rank's slots, in slot order (see the module docstring)."""
    keys, _ = group_keys(tables)
    key_index = {key: i for i, key in enumerate(keys)}
    return [
        [
            Slot(key_index[f], f, local.layout, local.shard, local.layout.slot_name(f, local.shard))
            for local in local_tables(tables, rank)
            for f in local.layout.config.feature_names
        ]
        for rank in range(world_size)
    ]


def digest(value: Any) -> bytes:
    """sha256 of a canonical text of `value` (JSON with sorted keys; repr for dataclasses)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).digest()
