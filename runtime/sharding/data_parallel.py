"""data_parallel: a whole replica of each table on every rank, kept identical.

The optimizer runs inside the embedding backward (fused TBE, or the dense
kernel's hook), so there is no gradient to all-reduce before it is applied.
Instead every replica applies the same global update:

- input_dist: every rank's ids go to every rank (table_wise.CopyInputDist
  with one slot per feature and rank), so each replica sees the global batch;
- lookup: each replica pools the global batch (rank 0's samples first);
- output_dist: a rank keeps its own samples' rows; in backward the pooled
  gradients of all ranks are all-gathered (all_gather_single) and divided by
  the world size, so every replica's kernel gets the gradient one process
  would compute on the global batch.

Sequence tables (`build_sequence`) work the same way: every replica looks
up one row per id of the global batch, a rank keeps its own samples' rows
(`ReplicatedSequenceOutputDist`), and backward gathers the row gradients of
every rank, blocks of different sizes, with one all_to_all_single.

This is exact for every optimizer, including rowwise_adagrad, whose update is
not linear in the gradient (averaging updates would not be), and needs no
hook on the embedding kernels. The price is the lookup of the global batch on
every rank, which data_parallel tables are chosen to make small.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from runtime.sparse.jagged import JaggedTensor, KeyedTensor
from runtime.process import shm_exchange
from runtime.sharding.awaitable import Awaitable, Done
from runtime.sharding.group import (
    EmbeddingGroup,
    GroupEnv,
    PooledShards,
    inverse_order,
    sharded_lookup,
    slot_columns,
)
from runtime.sharding.layout import Slot, TableLayout, group_keys, slots_by_rank
from runtime.sharding.sequence_dist import KeyRows
from runtime.sharding.sequence_group import SequenceShards, sequence_lookup
from runtime.sharding.table_wise import CopyInputDist, CopySequenceInputDist


class _LocalRows(torch.autograd.Function):
    """This rank's rows of the global batch; backward all-gathers every rank's gradients."""

    @staticmethod
    def forward(ctx: Any, pooled: torch.Tensor, rank: int, world_size: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.world_size, ctx.group = world_size, group
        batch = pooled.size(0) // world_size
        return pooled[rank * batch : (rank + 1) * batch].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        grad = grad.contiguous()
        gathered = grad.new_empty(ctx.world_size * grad.size(0), grad.size(1))
        dist.all_gather_single(gathered, grad, group=ctx.group)
        return gathered.div_(ctx.world_size), None, None, None


class ReplicatedOutputDist(nn.Module):
    """Keeps this rank's samples' rows, columns in table order (see the module docstring)."""

    def __init__(self, keys: Sequence[str], dims: Sequence[int], slots: Sequence[Slot], env: GroupEnv) -> None:
        super().__init__()
        self.keys, self.dims = list(keys), list(dims)
        self._rank, self._world_size, self._group = env.rank, env.world_size, env.process_group
        self.register_buffer("inverse", inverse_order(slot_columns(slots, dims)), persistent=False)

    def forward(self, pooled: PooledShards) -> Awaitable[KeyedTensor]:
        values = _LocalRows.apply(pooled.values, self._rank, self._world_size, self._group)
        if self.inverse is not None:
            values = values.index_select(1, self.inverse)
        return Done(KeyedTensor(self.keys, self.dims, values))


class _LocalBlock(torch.autograd.Function):
    """This rank's block of a flat [source]-ordered buffer; backward gathers every rank's block.

    The blocks differ in size (each rank's samples have their own ids), so
    the gather is an all_to_all_single that sends a rank's gradient to all.
    """

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, sizes: list[int], rank: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.sizes, ctx.rank, ctx.group = sizes, rank, group
        start = sum(sizes[:rank])
        return values[start : start + sizes[rank]].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        world_size = len(ctx.sizes)
        gathered = grad.new_empty(sum(ctx.sizes))
        shm_exchange.all_to_all_single(
            gathered,
            grad.contiguous().repeat(world_size),
            ctx.sizes,
            [ctx.sizes[ctx.rank]] * world_size,
            group=ctx.group,
        )
        return gathered.div_(world_size), None, None, None


class ReplicatedSequenceOutputDist(nn.Module):
    """Keeps this rank's samples' rows of every sequence key (see the module docstring)."""

    def __init__(self, keys: Sequence[str], slots: Sequence[Slot], env: GroupEnv) -> None:
        super().__init__()
        self.keys = list(keys)
        self._rows = KeyRows(keys, slots, by_position=False)
        self._rank, self._group = env.rank, env.process_group

    def forward(self, shards: SequenceShards) -> Awaitable[dict[str, JaggedTensor]]:
        received = shards.routed.received
        sizes = [sum(self._rows.block_sizes(row)) for row in received]
        mine = _LocalBlock.apply(shards.values, sizes, self._rank, self._group)
        return Done(self._rows(mine, received[self._rank], shards.routed))


def build(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The data_parallel group of `tables`."""
    keys, dims = group_keys(tables)
    slots = slots_by_rank(tables, env.world_size)
    return EmbeddingGroup(
        CopyInputDist(slots, env),
        sharded_lookup(tables, env),
        ReplicatedOutputDist(keys, dims, slots[env.rank], env),
    )


def build_sequence(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The data_parallel group of sequence `tables`."""
    keys, _ = group_keys(tables)
    slots = slots_by_rank(tables, env.world_size)
    return EmbeddingGroup(
        CopySequenceInputDist(slots, env),
        sequence_lookup(tables, env),
        ReplicatedSequenceOutputDist(keys, slots[env.rank], env),
    )
