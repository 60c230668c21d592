"""What the stages of a sequence group pass along, and its lookup stage.

A sequence group (`<sharding_type>_sequence` in SparseArch) has the three
stages of a bag group (group.py), but its lookup returns one row per id
instead of one pooled vector per bag, so the counts of everything that moves
are data: how many ids of each slot came from each rank, and how many this
rank sent to each slot. input_dist learns them in its counts exchange
(ids_dist.IdsAllToAll) and hands them along in `RoutedSequences`; the
output_dist sends the rows back with them as split sizes.

`SequenceLookup` is the lookup stage of every sequence type: the rank's
shards as sequence sub-tables (layout.LocalTable with an EmbeddingConfig) on
one EmbeddingCollection per compute kernel, kept out of the module tree as
ShardLookup keeps its bag collections. It returns the rows of all its slots
as one flat buffer in send order: source rank, then slot, then sample, each
slot's rows `cols` wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from runtime.embeddings.optim import EmbeddingOptimizer
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.sharding.awaitable import Awaitable
from runtime.sharding.group import GroupEnv
from runtime.sharding.layout import LocalTable, TableLayout, local_tables


@dataclass
class RoutedSequences:
    """What a sequence input_dist yields: the ids this rank looks up, and the counts to return rows.

    `received[s][j]`: ids of local slot j that came from source rank s;
    `sent[t]`: ids this rank sent to routed slot t (every rank's slots in
    rank order, each rank's in slot order); `lengths`: the local samples'
    lengths of the group's keys, key-major; `positions` (row_wise only): for
    each local id, key-major, the row among its key's returned rows that
    holds its embedding.
    """

    features: KeyedJaggedTensor  # this rank's slots, stride world_size * batch_size
    batch_size: int
    received: list[list[int]]
    sent: list[int]
    lengths: torch.Tensor
    positions: torch.Tensor | None = None


@dataclass
class SequenceShards:
    """What the sequence lookup yields: its slots' rows, flat, in send order."""

    values: torch.Tensor  # 1-D
    routed: RoutedSequences


class SequenceLookup(nn.Module):
    """Looks up this rank's slots with its shards' collections (see the module docstring)."""

    def __init__(
        self,
        tables: Sequence[LocalTable],
        optimizer: EmbeddingOptimizer,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.tables = list(tables)
        by_kernel: dict[str, list[LocalTable]] = {}
        for table in self.tables:
            by_kernel.setdefault(table.layout.kernel, []).append(table)
        self._collection_tables = list(by_kernel.values())
        self._collections = [
            EmbeddingCollection(
                [t.config for t in kernel_tables],  # type: ignore[misc]
                device=device,
                compute_kernel=kernel,
                optimizer=optimizer,
                bounds_check=False,
            )
            for kernel, kernel_tables in by_kernel.items()
        ]
        self._slots = [f for t in self.tables for f in t.config.feature_names]
        self._cols = [t.config.embedding_dim for t in self.tables for _ in t.config.feature_names]

    def collections(self) -> list[EmbeddingCollection]:
        return list(self._collections)

    def weights(self) -> list[tuple[LocalTable, torch.Tensor]]:
        """Each local table with its live weight (rows x cols of its shard)."""
        return [
            (table, collection.embedding_parameters()[table.config.name])
            for collection, tables in zip(self._collections, self._collection_tables)
            for table in tables
        ]

    def forward(self, ids: Awaitable[RoutedSequences]) -> SequenceShards:
        routed = ids.wait()
        if not self._collections:
            return SequenceShards(torch.zeros(0, device=routed.lengths.device), routed)
        rows: dict[str, torch.Tensor] = {}
        for collection in self._collections:
            rows.update((k, jt.values()) for k, jt in collection(routed.features).items())
        # Rows come per slot over all sources ([slot][source]); send order is [source][slot].
        per_slot = [
            rows[slot].split([counts[j] for counts in routed.received])
            for j, slot in enumerate(self._slots)
        ]
        pieces = [
            per_slot[j][source].reshape(-1)
            for source in range(len(routed.received))
            for j in range(len(self._slots))
        ]
        return SequenceShards(torch.cat(pieces), routed)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> SequenceLookup:
        # The collections are outside the module tree; move them with it.
        if recurse:
            for collection in self._collections:
                collection._apply(fn)
        return super()._apply(fn, recurse)


def sequence_lookup(tables: Sequence[TableLayout], env: GroupEnv) -> SequenceLookup:
    """The lookup of `env.rank`'s sequence shards; ids were range-checked where they were read."""
    return SequenceLookup(local_tables(tables, env.rank), env.optimizer, env.device)
