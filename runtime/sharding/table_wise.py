"""table_wise: every table whole on one rank.

- input_dist (`CopyInputDist`): the features are permuted into destination
  order (one fbgemm permute), checked against their tables' rows, and moved
  by `ids_dist.IdsAllToAll`: one small all_to_all_single of counts, then
  lengths and ids in one all_to_all_single (weights in a second; no lengths
  from a rank whose bags of each feature all hold as many ids); at two ranks
  unweighted, the counts ride in the ids' exchange.
- lookup: the owner pools its tables for the global batch, on one fused TBE
  per kernel, optimizer and pooling.
- output_dist (`pooled_dist.PooledOutputDist`): each rank gets its samples'
  rows back in one all_to_all_single and places the columns in table order.

column_wise and data_parallel reuse `CopyInputDist`: it sends every slot's
ids unchanged to the slot's rank, whether the slot is a whole table, a
column shard or a replica.

Sequence tables (`build_sequence`) take the same route with
`CopySequenceInputDist`, which also keeps the counts the rows go back with,
and `sequence_dist.SequenceOutputDist`: the owner looks up one row per id
and sends each sample's rows back to its rank.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.sharding.awaitable import Awaitable
from runtime.sharding.group import EmbeddingGroup, GroupEnv, RoutedIds, sharded_lookup
from runtime.sharding.ids_dist import FeatureSelection, IdsAllToAll, id_check
from runtime.sharding.layout import Slot, TableLayout, group_keys, slots_by_rank
from runtime.sharding.pooled_dist import PooledOutputDist
from runtime.sharding.sequence_dist import SequenceOutputDist
from runtime.sharding.sequence_group import RoutedSequences, sequence_lookup


class CopyInputDist(nn.Module):
    """Sends each slot's ids, unchanged, to the rank that looks the slot up.

    `weighted` (default: the group's) says whether per-id weights travel too.
    """

    def __init__(self, slots: Sequence[Sequence[Slot]], env: GroupEnv, weighted: bool | None = None) -> None:
        super().__init__()
        weighted = env.is_weighted if weighted is None else weighted
        routed = [slot for rank_slots in slots for slot in rank_slots]
        self._select = FeatureSelection([slot.feature for slot in routed], weighted)
        self._check = id_check(
            [slot.feature for slot in routed],
            [slot.layout.config.describe() for slot in routed],
            [slot.layout.config.num_embeddings for slot in routed],
            env.rank,
        )
        self._ids = IdsAllToAll(
            [len(rank_slots) for rank_slots in slots],
            [slot.name for slot in slots[env.rank]],
            env.process_group,
            weighted,
        )

    def forward(self, features: KeyedJaggedTensor) -> Awaitable[RoutedIds]:
        routed = self._select(self._check(features))
        pending = self._ids.start(routed)
        batch = features.stride()
        return Awaitable(lambda: RoutedIds(pending.wait(), batch))


class CopySequenceInputDist(CopyInputDist):
    """`CopyInputDist` for sequence tables: no weights, and the counts the rows go back with."""

    def __init__(self, slots: Sequence[Sequence[Slot]], env: GroupEnv) -> None:
        super().__init__(slots, env, weighted=False)
        routed = [slot for rank_slots in slots for slot in rank_slots]
        # Each key's lengths: those of the first routed slot that carries it.
        first: dict[int, int] = {}
        for t, slot in enumerate(routed):
            first.setdefault(slot.key_index, t)
        key_rows = torch.tensor([first[k] for k in sorted(first)], dtype=torch.int64)
        self.register_buffer("key_rows", key_rows, persistent=False)

    def forward(self, features: KeyedJaggedTensor) -> Awaitable[RoutedSequences]:  # type: ignore[override]
        routed = self._select(self._check(features))
        batch = routed.stride()
        pending, received = self._ids.start_counted(routed)
        lengths = routed.lengths().view(-1, batch).index_select(0, self.key_rows).view(-1)
        sent = routed.length_per_key()
        return Awaitable(lambda: RoutedSequences(pending.wait(), batch, received, sent, lengths))


def build(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The table_wise group of `tables` (also column_wise: see column_wise.py)."""
    keys, dims = group_keys(tables)
    slots = slots_by_rank(tables, env.world_size)
    return EmbeddingGroup(
        CopyInputDist(slots, env),
        sharded_lookup(tables, env),
        PooledOutputDist(keys, dims, slots, env.rank, env.process_group, partial_sums=False),
    )


def build_sequence(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The table_wise group of sequence `tables` (also column_wise: see column_wise.py)."""
    keys, _ = group_keys(tables)
    slots = slots_by_rank(tables, env.world_size)
    return EmbeddingGroup(
        CopySequenceInputDist(slots, env),
        sequence_lookup(tables, env),
        SequenceOutputDist(keys, slots, env.rank, env.process_group, by_position=False),
    )
