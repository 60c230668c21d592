"""A group's three stages, what passes between them, and the lookup stage.

Every sharding type is an `EmbeddingGroup` with the children the compiled
graph calls: `input_dist(kjt) -> Awaitable[RoutedIds]`, `lookup(awaitable)
-> PooledShards` and `output_dist(pooled) -> Awaitable[KeyedTensor]`. The
values passed along carry what later stages need (the local batch size, the
bag lengths for mean pooling of partial sums), so no stage keeps per-batch
state and a pipeline may run batch i+1's input_dist before batch i's
output_dist.

`ShardLookup` is the lookup stage of every type: the rank's shards as
sub-tables (`layout.LocalTable`) on one EmbeddingBagCollection per compute
kernel, each grouping its tables into one fbgemm TBE per optimizer and
pooling. The collections are kept out of the module tree, as a collection
keeps its TBEs, so that SparseArch writes the state dict itself (shard names,
no group prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from runtime.config.embeddings import EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.sharding.awaitable import Awaitable
from runtime.sharding.layout import LocalTable, Slot, TableLayout, local_tables
from runtime.sparse.jagged import KeyedJaggedTensor


@dataclass(frozen=True)
class GroupEnv:
    """Where a group runs: what every sharding type's builder takes besides its tables."""

    rank: int
    world_size: int
    process_group: dist.ProcessGroup | None
    device: torch.device
    optimizer: EmbeddingOptimizer
    is_weighted: bool


@dataclass
class RoutedIds:
    """What input_dist yields: the ids this rank looks up, over the global batch."""

    features: KeyedJaggedTensor  # this rank's slots; stride world_size * batch_size
    batch_size: int  # the local batch size (the same on every rank)
    divisor: torch.Tensor | None = None  # batch_size x width: full bag lengths of mean keys


@dataclass
class PooledShards:
    """What the lookup yields: pooled rows of this rank's slots, rank 0's samples first."""

    # (world_size * batch_size) x (sum of this rank's slot widths); from a lookup built with
    # `parts=True`, maybe the (B, w) blocks that make it up side by side, as the collection pooled them
    values: torch.Tensor | tuple[torch.Tensor, ...]
    batch_size: int
    divisor: torch.Tensor | None = None


class EmbeddingGroup(nn.Module):
    """The tables of one sharding type: the three stages the compiled graph calls."""

    def __init__(self, input_dist: nn.Module, lookup: nn.Module, output_dist: nn.Module) -> None:
        super().__init__()
        self.input_dist = input_dist
        self.lookup = lookup
        self.output_dist = output_dist


class KernelCollections(nn.Module):
    """This rank's shards as sub-tables on one collection per compute kernel, kept outside the tree.

    `make_collection(configs, kernel)` builds one collection (bag or sequence)
    of the shards that use `kernel`; the lookup stages of both kinds share the
    rest: the weights by local table, and moving the collections with the module.
    """

    def __init__(self, tables: Sequence[LocalTable], make_collection: Callable[[list[Any], str], Any]) -> None:
        super().__init__()
        self.tables = list(tables)
        by_kernel: dict[str, list[LocalTable]] = {}
        for table in self.tables:
            by_kernel.setdefault(table.layout.kernel, []).append(table)
        self._collection_tables = list(by_kernel.values())
        self._collections = [
            make_collection([t.config for t in kernel_tables], kernel) for kernel, kernel_tables in by_kernel.items()
        ]

    def collections(self) -> list[Any]:
        return list(self._collections)

    def weights(self) -> list[tuple[LocalTable, torch.Tensor]]:
        """Each local table with its live weight (rows x cols of its shard)."""
        return [
            (table, collection.embedding_parameters()[table.config.name])
            for collection, tables in zip(self._collections, self._collection_tables)
            for table in tables
        ]

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> KernelCollections:
        # The collections are outside the module tree; move them with it.
        if recurse:
            for collection in self._collections:
                collection._apply(fn)
        return super()._apply(fn, recurse)


class ShardLookup(KernelCollections):
    """Pools this rank's slots with its shards' collections (see the module docstring).

    With `parts`, a single collection's pooled blocks are handed on as it made them (a
    KeyedTensor's `parts()`) instead of placed in one tensor: for an output_dist that reads them.
    """

    def __init__(
        self,
        tables: Sequence[LocalTable],
        optimizer: EmbeddingOptimizer,
        device: torch.device,
        is_weighted: bool,
        bounds_check: bool,
        parts: bool = False,
    ) -> None:
        super().__init__(
            tables,
            lambda configs, kernel: EmbeddingBagCollection(
                configs,
                is_weighted=is_weighted,
                device=device,
                compute_kernel=kernel,
                optimizer=optimizer,
                bounds_check=bounds_check,
            ),
        )
        self._keys = [f for t in self.tables for f in t.config.feature_names]
        self._splits = [len(c.feature_names()) for c in self._collections]
        self._parts = parts

    def forward(self, ids: Awaitable[RoutedIds]) -> PooledShards:
        routed = ids.wait()
        return PooledShards(self._pool(routed.features), routed.batch_size, routed.divisor)

    def _pool(self, features: KeyedJaggedTensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Pooled rows, columns in slot order (in blocks, with `parts`, where the collection made them so)."""
        if not self._collections:
            return torch.zeros(features.stride(), 0, device=features.device())
        if len(self._collections) == 1:
            pooled = self._collections[0](features)
            return (self._parts and pooled.parts()) or pooled.values()
        # Routed ids come in slot order and split for free; others are selected per collection.
        parts = features.split(self._splits) if features.keys() == self._keys else [features] * len(self._collections)
        return torch.cat([c(p).values() for c, p in zip(self._collections, parts)], dim=1)


def sharded_lookup(tables: Sequence[TableLayout], env: GroupEnv) -> ShardLookup:
    """The lookup of `env.rank`'s shards; ids were range-checked where they were read."""
    return ShardLookup(local_tables(tables, env.rank), env.optimizer, env.device, env.is_weighted, False)


def slot_offsets(slots: Sequence[Slot], dims: Sequence[int]) -> list[int]:
    """The first column of each slot's pooled block in the group's output."""
    key_offsets = [0]
    for dim in dims:
        key_offsets.append(key_offsets[-1] + dim)
    return [key_offsets[slot.key_index] + slot.shard.col_offset for slot in slots]


def slot_columns(slots: Sequence[Slot], dims: Sequence[int]) -> list[int]:
    """For each pooled column of `slots` (in slot order), its column in the group's output."""
    return [offset + c for slot, offset in zip(slots, slot_offsets(slots, dims)) for c in range(slot.shard.cols)]


def inverse_order(columns: Sequence[int]) -> torch.Tensor | None:
    """The index that puts columns given in `columns` order back in order; None if they are."""
    if list(columns) == list(range(len(columns))):
        return None
    inverse = torch.empty(len(columns), dtype=torch.int64)
    inverse[torch.tensor(columns, dtype=torch.int64)] = torch.arange(len(columns))
    return inverse
