"""row_wise: each table split into row ranges, one per rank.

- input_dist (`RowWiseInputDist`): the group's features are selected (one
  fbgemm permute) and range-checked, every id is bucketised by the row range
  holding it and rebased to that range's first row (bucketize.RowBuckets,
  one fbgemm block_bucketize_sparse_features), the (bucket, feature) blocks
  are permuted into destination order, and ids_dist.IdsAllToAll moves them
  (counts all_to_all_single, then lengths + ids in one, weights in another).
- lookup: each rank pools its row ranges for the global batch by sum, on one
  fused TBE: partial sums of every bag.
- output_dist (`pooled_dist.PooledOutputDist`): partial sums go back to the
  samples' ranks in one all_to_all_single and are added up there, which is a
  reduce-scatter made of the collectives gloo has; mean bags are then
  divided by their full length, so mean pooling stays exact.

table_row_wise (table_row_wise.py) is this over the ranks of one host: the
routing follows each table's shards, wherever they are.

Sequence tables (`build_sequence`) route ids the same way
(`RowWiseSequenceInputDist`); each shard looks up one row per id it holds,
and `sequence_dist.SequenceOutputDist` sends the rows back to the samples'
ranks, where they are put back at their ids' places. Every id is in exactly
one shard, so nothing is summed.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.sharding.awaitable import Awaitable
from runtime.sharding.bucketize import RowBuckets
from runtime.sharding.group import EmbeddingGroup, GroupEnv, RoutedIds, sharded_lookup
from runtime.sharding.ids_dist import FeatureSelection, IdsAllToAll, id_check
from runtime.sharding.layout import Slot, TableLayout, group_keys, slots_by_rank
from runtime.sharding.pooled_dist import PooledOutputDist
from runtime.sharding.sequence_dist import SequenceOutputDist
from runtime.sharding.sequence_group import RoutedSequences, sequence_lookup


class RowWiseInputDist(nn.Module):
    """Sends each id to the rank holding its row (see the module docstring)."""

    def __init__(self, tables: Sequence[TableLayout], slots: Sequence[Sequence[Slot]], env: GroupEnv) -> None:
        super().__init__()
        self._keys, dims = group_keys(tables)
        key_tables = [t for t in tables for _ in t.config.feature_names]
        self._is_weighted = env.is_weighted
        self._select = FeatureSelection(self._keys, env.is_weighted)
        self._check = id_check(
            self._keys,
            [t.config.describe() for t in key_tables],
            [t.config.num_embeddings for t in key_tables],
            env.rank,
        )
        self._buckets = RowBuckets([[s.row_offset for s in t.shards] + [t.config.num_embeddings] for t in key_tables])
        # Row (bucket, key) of the bucketised lengths that each destination slot takes.
        bucket = {(t.config.name, s): b for t in tables for b, s in enumerate(t.shards)}
        route = [
            bucket[slot.layout.config.name, slot.shard] * len(self._keys) + slot.key_index
            for rank_slots in slots
            for slot in rank_slots
        ]
        self._route_names = [slot.name for rank_slots in slots for slot in rank_slots]
        self._ids = IdsAllToAll(
            [len(rank_slots) for rank_slots in slots],
            [slot.name for slot in slots[env.rank]],
            env.process_group,
            env.is_weighted,
        )
        mean = [t.config.pooling == "mean" for t in key_tables]
        mean_keys = torch.tensor(mean) if any(mean) else None
        self.register_buffer("route", torch.tensor(route, dtype=torch.int32), persistent=False)
        self.register_buffer("mean_keys", mean_keys, persistent=False)
        self.register_buffer("dims", torch.tensor(dims), persistent=False)
        self._width = sum(dims)

    def forward(self, features: KeyedJaggedTensor) -> Awaitable[RoutedIds]:
        grouped = self._select(self._check(features))
        weights = grouped.weights_or_none() if self._is_weighted else None
        lengths, values, weights = self._buckets(grouped.lengths(), grouped.values(), weights)
        batch = grouped.stride()
        lengths, values, weights = torch.ops.fbgemm.permute_2D_sparse_data(
            self.route, lengths.view(-1, batch), values, weights, values.numel()
        )
        routed = KeyedJaggedTensor(self._route_names, values, weights, lengths.view(-1), stride=batch)
        divisor = self._divisor(grouped)
        pending = self._ids.start(routed)
        return Awaitable(lambda: RoutedIds(pending.wait(), batch, divisor))

    def _divisor(self, grouped: KeyedJaggedTensor) -> torch.Tensor | None:
        """batch x width: each mean key's bag lengths (at least 1) over its columns, else 1."""
        if self.mean_keys is None:
            return None
        lengths = grouped.lengths().view(len(self._keys), grouped.stride()).t()
        per_key = torch.where(self.mean_keys, lengths.clamp(min=1), 1).to(torch.float32)
        return per_key.repeat_interleave(self.dims, dim=1, output_size=self._width)


class RowWiseSequenceInputDist(nn.Module):
    """Sends each id of a sequence to the rank holding its row, and notes where it came from.

    As `RowWiseInputDist` without weights, plus `RoutedSequences.positions`:
    fbgemm's bucketisation in sequence mode gives each id's place among the
    bucketised ids, the route permutes those places into send order, and
    each id's place among its key's returned rows follows (see
    sequence_dist.KeyRows).
    """

    def __init__(self, tables: Sequence[TableLayout], slots: Sequence[Sequence[Slot]], env: GroupEnv) -> None:
        super().__init__()
        keys, _ = group_keys(tables)
        key_tables = [t for t in tables for _ in t.config.feature_names]
        self._select = FeatureSelection(keys, False)
        self._check = id_check(
            keys,
            [t.config.describe() for t in key_tables],
            [t.config.num_embeddings for t in key_tables],
            env.rank,
        )
        self._buckets = RowBuckets([[s.row_offset for s in t.shards] + [t.config.num_embeddings] for t in key_tables])
        bucket = {(t.config.name, s): b for t in tables for b, s in enumerate(t.shards)}
        routed = [slot for rank_slots in slots for slot in rank_slots]
        route = [bucket[s.layout.config.name, s.shard] * len(keys) + s.key_index for s in routed]
        self._route_names = [slot.name for slot in routed]
        self._route_keys = [slot.key_index for slot in routed]
        self._key_count = len(keys)
        self._ids = IdsAllToAll(
            [len(rank_slots) for rank_slots in slots],
            [slot.name for slot in slots[env.rank]],
            env.process_group,
            False,
        )
        self.register_buffer("route", torch.tensor(route, dtype=torch.int32), persistent=False)

    def forward(self, features: KeyedJaggedTensor) -> Awaitable[RoutedSequences]:
        grouped = self._select(self._check(features))
        batch = grouped.stride()
        lengths, values, places = self._buckets.with_positions(grouped.lengths(), grouped.values())
        lengths = lengths.view(-1, batch)
        order = torch.arange(values.numel(), device=values.device)
        _, order, _ = torch.ops.fbgemm.permute_2D_sparse_data(self.route, lengths, order, None, values.numel())
        lengths, values, _ = torch.ops.fbgemm.permute_2D_sparse_data(self.route, lengths, values, None, values.numel())
        routed = KeyedJaggedTensor(self._route_names, values, None, lengths.view(-1), stride=batch)
        pending, received = self._ids.start_counted(routed)
        sent = routed.length_per_key()
        positions = self._positions(order, places.long(), sent)
        return Awaitable(lambda: RoutedSequences(pending.wait(), batch, received, sent, grouped.lengths(), positions))

    def _positions(self, order: torch.Tensor, places: torch.Tensor, sent: list[int]) -> torch.Tensor:
        """Each id's row among its key's returned rows (its key's slots' blocks in send order).

        `order[p]`: the bucketised place of the id sent at p; `places[i]`: id i's bucketised place.
        """
        sent_at = torch.empty_like(order)
        sent_at[order] = torch.arange(order.numel(), device=order.device)
        # Send position -> position among its key's ids: less the other keys' ids sent before.
        shift, start, before = [], 0, [0] * self._key_count
        for key, count in zip(self._route_keys, sent):
            shift.append(start - before[key])
            before[key] += count
            start += count
        device = order.device
        shifts = torch.tensor(shift, device=device).repeat_interleave(
            torch.tensor(sent, device=device), output_size=order.numel()
        )
        key_rows = torch.arange(order.numel(), device=device) - shifts
        return key_rows.index_select(0, sent_at.index_select(0, places))


def build(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The row-sharded group of `tables` (row_wise, or table_row_wise)."""
    keys, dims = group_keys(tables)
    slots = slots_by_rank(tables, env.world_size)
    return EmbeddingGroup(
        RowWiseInputDist(tables, slots, env),
        sharded_lookup(tables, env),
        PooledOutputDist(keys, dims, slots, env.rank, env.process_group, partial_sums=True),
    )


def build_sequence(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The row_wise group of sequence `tables`."""
    keys, _ = group_keys(tables)
    slots = slots_by_rank(tables, env.world_size)
    return EmbeddingGroup(
        RowWiseSequenceInputDist(tables, slots, env),
        sequence_lookup(tables, env),
        SequenceOutputDist(keys, slots, env.rank, env.process_group, by_position=True),
    )
