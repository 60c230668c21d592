"""The lookup stage of sequence tables, and their world-size-1 group.

A sequence table (`EmbeddingConfig`) is looked up as rows, one per id, by
`EmbeddingCollection`: the lookup stage of every sharding type holds the
rank's shards as sub-tables on one collection per compute kernel, as
`group.ShardLookup` does for bags, and yields each slot's rows over the ids
it was routed (`SequenceRows`). The output stages differ by sharding type;
at world size 1 (`build_local`) the rows are already the local samples'
and output_dist hands them on in the group's key order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from runtime.config.embeddings import EmbeddingOptimizer
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.sharding.awaitable import Awaitable, Done
from runtime.sharding.group import EmbeddingGroup, GroupEnv, KernelCollections, RoutedIds
from runtime.sharding.layout import LocalTable, Shard, TableLayout, group_keys, local_tables
from runtime.sharding.local import LocalInputDist
from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor


@dataclass
class SequenceRows:
    """What the lookup of sequence tables yields: each slot's rows over the ids routed to it."""

    rows: dict[str, JaggedTensor]  # by slot name; lengths over the routed batch
    batch_size: int  # the local batch size (the same on every rank)


class SequenceShardLookup(KernelCollections):
    """Looks up this rank's sequence shards, one EmbeddingCollection per compute kernel."""

    def __init__(
        self,
        tables: Sequence[LocalTable],
        optimizer: EmbeddingOptimizer,
        device: torch.device,
        bounds_check: bool,
    ) -> None:
        super().__init__(
            tables,
            lambda configs, kernel: EmbeddingCollection(
                configs,
                device=device,
                compute_kernel=kernel,
                optimizer=optimizer,
                bounds_check=bounds_check,
            ),
        )

    def forward(self, ids: Awaitable[RoutedIds]) -> SequenceRows:
        routed = ids.wait()
        return SequenceRows(self.rows(routed.features), routed.batch_size)

    def rows(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """Each slot's rows; the KeyedJaggedTensor may hold other keys."""
        rows: dict[str, JaggedTensor] = {}
        for collection in self._collections:
            rows.update(collection(features))
        return rows


class LocalSequenceOutputDist(nn.Module):
    """Hands the rows on, keyed by feature in the group's key order."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__()
        self.keys = keys

    def forward(self, looked_up: SequenceRows) -> Awaitable[dict[str, JaggedTensor]]:
        return Done({key: looked_up.rows[key] for key in self.keys})


def build_local(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """All of the sequence `tables`, whole, on this single rank."""
    whole = [
        TableLayout(
            t.config,
            "table_wise",
            t.kernel,
            (Shard(0, 0, t.config.num_embeddings, 0, t.config.embedding_dim),),
        )
        for t in tables
    ]
    keys, _ = group_keys(whole)
    return EmbeddingGroup(
        LocalInputDist(whole),
        SequenceShardLookup(local_tables(whole, 0), env.optimizer, env.device, False),
        LocalSequenceOutputDist(keys),
    )
