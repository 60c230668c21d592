"""One rank's stages when nothing is distributed: the world-size-1 program.

The stages still exist (input_dist -> lookup -> output_dist) so a model has
the same structure at every world size; here input_dist checks the batch
(the lookup then trusts it), output_dist hands values through and the
lookup pools whole tables, whatever the sharding type (at world size
1 every shard of the plan is on rank 0).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from runtime.embeddings.ids import IdCheck
from runtime.sparse.jagged import KeyedJaggedTensor, KeyedTensor
from runtime.sharding.awaitable import Awaitable, Done
from runtime.sharding.group import (
    EmbeddingGroup,
    GroupEnv,
    PooledShards,
    RoutedIds,
    ShardLookup,
    inverse_order,
    slot_columns,
)
from runtime.sharding.layout import Shard, TableLayout, group_keys, local_tables, slots_by_rank


class LocalInputDist(nn.Module):
    """Checks the batch against the tables (runtime/embeddings/ids.py) and hands it on."""

    def __init__(self, tables: Sequence[TableLayout]) -> None:
        super().__init__()
        features = [(f, t.config) for t in tables for f in t.config.feature_names]
        self._check = IdCheck(
            [f for f, _ in features],
            [c.describe() for _, c in features],
            [c.num_embeddings for _, c in features],
        )

    def forward(self, features: KeyedJaggedTensor) -> Awaitable[RoutedIds]:
        checked = self._check(features)
        return Done(RoutedIds(checked, checked.stride()))


class LocalOutputDist(nn.Module):
    """Puts the lookup's columns (kernel by kernel) in table order."""

    def __init__(self, keys: list[str], dims: list[int], columns: list[int]) -> None:
        super().__init__()
        self.keys, self.dims = keys, dims
        self.register_buffer("inverse", inverse_order(columns), persistent=False)

    def forward(self, pooled: PooledShards) -> Awaitable[KeyedTensor]:
        values = pooled.values  # the collection's blocks, in order, are handed on as they are
        if self.inverse is not None:
            values = (torch.cat(values, dim=1) if isinstance(values, tuple) else values).index_select(1, self.inverse)
        return Done(KeyedTensor(self.keys, self.dims, values))


def build(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """All of `tables`, whole, on this single rank."""
    whole = [
        TableLayout(
            t.config,
            "table_wise",
            t.kernel,
            (Shard(0, 0, t.config.num_embeddings, 0, t.config.embedding_dim),),
        )
        for t in tables
    ]
    keys, dims = group_keys(whole)
    (slots,) = slots_by_rank(whole, 1)
    return EmbeddingGroup(
        LocalInputDist(whole),
        ShardLookup(local_tables(whole, 0), env.optimizer, env.device, env.is_weighted, False, parts=True),
        LocalOutputDist(keys, dims, slot_columns(slots, dims)),
    )
