"""What the stages of a sequence group pass along, and its lookup stage.

A sequence group (`<sharding_type>_sequence` in SparseArch) has the three
stages of a bag group (group.py), but its lookup returns one row per id
instead of one pooled vector per bag, so the counts of everything that moves
are data: how many ids of each slot came from each rank, and how many this
rank sent to each slot. input_dist learns them in its counts exchange
(ids_dist.IdsAllToAll) and hands them along in `RoutedSequences`; the
output_dist sends the rows back with them as split sizes.

`SequenceLookup` is the lookup stage of every sequence type over several
ranks: the rank's shards on sequence_lookup.SequenceShardLookup's
collections, its rows returned as one flat buffer in send order: source
rank, then slot, then sample, each slot's rows `cols` wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from runtime.config.embeddings import EmbeddingOptimizer
from runtime.sharding.awaitable import Awaitable
from runtime.sharding.group import GroupEnv
from runtime.sharding.layout import LocalTable, TableLayout, local_tables
from runtime.sharding.sequence_lookup import SequenceShardLookup
from runtime.sparse.jagged import KeyedJaggedTensor


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


class SequenceLookup(SequenceShardLookup):
    """The sequence lookup over several ranks: rows in send order (see the module docstring)."""

    def __init__(self, tables: Sequence[LocalTable], optimizer: EmbeddingOptimizer, device: torch.device) -> None:
        super().__init__(tables, optimizer, device, bounds_check=False)
        self._slots = [f for t in self.tables for f in t.config.feature_names]

    def forward(self, ids: Awaitable[RoutedSequences]) -> SequenceShards:  # type: ignore[override]
        routed = ids.wait()
        if not self._slots:
            return SequenceShards(torch.zeros(0, device=routed.lengths.device), routed)
        rows = self.rows(routed.features)
        # Rows come per slot over all sources ([slot][source]); send order is [source][slot].
        per_slot = [
            rows[slot].values().split([counts[j] for counts in routed.received]) for j, slot in enumerate(self._slots)
        ]
        pieces = [
            per_slot[j][source].reshape(-1) for source in range(len(routed.received)) for j in range(len(self._slots))
        ]
        return SequenceShards(torch.cat(pieces), routed)


def sequence_lookup(tables: Sequence[TableLayout], env: GroupEnv) -> SequenceLookup:
    """The lookup of `env.rank`'s sequence shards; ids were range-checked where they were read."""
    return SequenceLookup(local_tables(tables, env.rank), env.optimizer, env.device)
