"""The output_dist of the model-parallel types: pooled rows back to their samples' ranks.

The lookup on rank o pools its slots for the global batch; rows of rank s's
samples go back to s in one all_to_all_single, started by output_dist and
waited for by the awaitable it returns (the compiled graph waits just before
the first use, so the bottom MLP runs meanwhile). The receiver places each
owner's columns in the group's key order:

- table_wise and column_wise: owners hold disjoint columns (whole tables, or
  column shards): one concatenation of every slot's block in key order;
- row_wise and table_row_wise: owners hold partial sums of the same columns:
  add them up (the all-to-all then a local sum is a reduce-scatter built from
  what gloo has), then divide mean bags by their full length.

Backward runs the all-to-all the other way, also asynchronously, and divides
the gradients by the world size, as TorchRec does: each rank's loss is the
mean over its own batch, so the gradient of the global-batch mean is
1/world_size of the sum an owner receives (DDP averages dense gradients the
same way).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from runtime.sparse.jagged import KeyedTensor
from runtime.sharding.awaitable import Awaitable
from runtime.sharding.group import PooledShards, inverse_order, slot_columns, slot_offsets
from runtime.sharding.layout import Slot


class _Exchange:
    """One differentiable all-to-all: its splits and, while in flight, its handles."""

    def __init__(self, sent: list[int], received: list[int], group: dist.ProcessGroup) -> None:
        self.sent, self.received, self.group = sent, received, group
        self.world_size = len(sent)
        self.output: torch.Tensor | None = None
        self.handle: Any = None
        self.grad: torch.Tensor | None = None
        self.grad_handle: Any = None


class _Start(torch.autograd.Function):
    """Starts the all-to-all; in backward, waits for the gradients' one and scales them."""

    @staticmethod
    def forward(
        ctx: Any, exchange: _Exchange, token: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        exchange.output = values.new_empty(sum(exchange.received))
        exchange.handle = dist.all_to_all_single(
            exchange.output, values, exchange.received, exchange.sent,
            group=exchange.group, async_op=True,
        )
        ctx.exchange = exchange
        return token.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        exchange = ctx.exchange
        exchange.grad_handle.wait()
        grad, exchange.grad, exchange.grad_handle = exchange.grad, None, None
        return None, None, grad.div_(exchange.world_size)


class _Wait(torch.autograd.Function):
    """Waits for the all-to-all; in backward, starts the gradients' one."""

    @staticmethod
    def forward(ctx: Any, exchange: _Exchange, started: torch.Tensor) -> torch.Tensor:
        exchange.handle.wait()
        ctx.exchange = exchange
        # Drop the exchange's references once used: the output (and later the gradient)
        # held by ctx.exchange would be a cycle through the autograd graph that Python's
        # collector cannot see, leaking every step's buffers.
        output, exchange.output, exchange.handle = exchange.output, None, None
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        exchange = ctx.exchange
        exchange.grad = grad.new_empty(sum(exchange.sent))
        exchange.grad_handle = dist.all_to_all_single(
            exchange.grad, grad.contiguous(), exchange.sent, exchange.received,
            group=exchange.group, async_op=True,
        )
        return None, grad.new_empty(0)


def all_to_all_pooled(
    values: torch.Tensor, sent: list[int], received: list[int], group: dist.ProcessGroup
) -> Awaitable[torch.Tensor]:
    """Starts a differentiable all-to-all of the 1-D `values`; the awaitable yields what arrived.

    Both directions take part in autograd on every rank, even one whose own
    values need no gradient (it owns nothing), so its peers never wait for
    a backward collective it skips.
    """
    exchange = _Exchange(sent, received, group)
    token = torch.empty(0, device=values.device, requires_grad=torch.is_grad_enabled())
    started = _Start.apply(exchange, token, values)
    return Awaitable(lambda: _Wait.apply(exchange, started))


class PooledOutputDist(nn.Module):
    """Pooled rows back to their ranks, columns in key order (see the module docstring)."""

    def __init__(
        self,
        keys: Sequence[str],
        dims: Sequence[int],
        slots_by_rank: Sequence[Sequence[Slot]],
        rank: int,
        process_group: dist.ProcessGroup,
        partial_sums: bool,
    ) -> None:
        super().__init__()
        self.keys, self.dims = list(keys), list(dims)
        self._rank, self._group = rank, process_group
        columns = [slot_columns(slots, dims) for slots in slots_by_rank]
        self._widths = [len(c) for c in columns]
        self._owners = [r for r, width in enumerate(self._widths) if width]
        self._slot_widths = [[slot.shard.cols for slot in slots] for slots in slots_by_rank]
        # Disjoint columns: the slots' blocks sorted by their first column are in key order.
        starts = [offset for slots in slots_by_rank for offset in slot_offsets(slots, dims)]
        self._order = sorted(range(len(starts)), key=starts.__getitem__)
        self._partial_sums = partial_sums
        # Partial sums where every rank holds every column in one order: one sum over ranks.
        everywhere = all(c == columns[0] for c in columns) and self._widths[0] == sum(dims)
        self._stacked = partial_sums and everywhere
        inverse = inverse_order(columns[0]) if self._stacked else None
        self.register_buffer("inverse", inverse, persistent=False)
        if partial_sums and not self._stacked:
            for r in self._owners:
                self.register_buffer(f"columns_{r}", torch.tensor(columns[r]), persistent=False)

    def forward(self, pooled: PooledShards) -> Awaitable[KeyedTensor]:
        batch = pooled.batch_size
        received = [batch * width for width in self._widths]
        sent = [batch * self._widths[self._rank]] * len(self._widths)
        pending = all_to_all_pooled(pooled.values.reshape(-1), sent, received, self._group)

        def finish() -> KeyedTensor:
            values = self._combine(pending.wait(), batch)
            if pooled.divisor is not None:
                values = values / pooled.divisor
            return KeyedTensor(self.keys, self.dims, values)

        return Awaitable(finish)

    def _combine(self, received: torch.Tensor, batch: int) -> torch.Tensor:
        """The owners' blocks in key order: disjoint columns placed, partial sums added."""
        if self._stacked:
            total = received.view(len(self._widths), batch, -1).sum(dim=0)
            return total if self.inverse is None else total.index_select(1, self.inverse)
        blocks = received.split([batch * width for width in self._widths])
        blocks = [blocks[r].view(batch, self._widths[r]) for r in self._owners]
        if self._partial_sums:
            total = blocks[0].new_zeros(batch, sum(self.dims))
            for r, block in zip(self._owners, blocks):
                total = total.index_add(1, getattr(self, f"columns_{r}"), block)
            return total
        # One copy forward (and split's cat backward), where a column gather would cost two.
        pieces = [
            piece
            for r, block in zip(self._owners, blocks)
            for piece in block.split(self._slot_widths[r], dim=1)
        ]
        return torch.cat([pieces[i] for i in self._order], dim=1) if len(pieces) > 1 else pieces[0]

