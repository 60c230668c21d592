"""The output_dist of the model-parallel types: pooled rows back to their samples' ranks.

The lookup on rank o pools its slots for the global batch; rows of rank s's
samples go back to s in one all_to_all_single, started by output_dist and
waited for by the awaitable it returns (the compiled graph waits just before
the first use, so the bottom MLP runs meanwhile). The receiver places each
owner's columns in the group's key order:

- table_wise and column_wise: owners hold disjoint columns (whole tables, or
  column shards). The KeyedTensor's values come as ColumnPieces of the
  received buffer: a consumer that reads pieces where they lie (the dot
  interaction) takes them so, with no copy either way; the first `values()`
  concatenates them in key order, and its backward copies the gradient back
  into the buffer's layout in one concatenation per rank;
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

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from runtime.sparse.jagged import KeyedTensor
from runtime.process import shm_exchange
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
    def forward(ctx: Any, exchange: _Exchange, token: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        exchange.output = values.new_empty(sum(exchange.received))
        exchange.handle = shm_exchange.all_to_all_single(
            exchange.output,
            values,
            exchange.received,
            exchange.sent,
            group=exchange.group,
            async_op=True,
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
        exchange.grad_handle = shm_exchange.all_to_all_single(
            exchange.grad,
            grad.contiguous(),
            exchange.sent,
            exchange.received,
            group=exchange.group,
            async_op=True,
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
        self._placement = _Placement.of(slots_by_rank, dims)
        self._widths = list(self._placement.widths)
        self._owners = [r for r, width in enumerate(self._widths) if width]
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
        values = pooled.values
        assert isinstance(values, torch.Tensor), "a lookup built with parts=True feeds the local program only"
        pending = all_to_all_pooled(values.reshape(-1), sent, received, self._group)

        return Awaitable(lambda: self.keyed(pending.wait(), batch, pooled.divisor))

    def keyed(self, received: torch.Tensor, batch: int, divisor: torch.Tensor | None = None) -> KeyedTensor:
        """What arrived (1-D, each rank's block after the other) as the group's KeyedTensor; mean
        bags of partial sums divided by their full length, `divisor`."""
        if not self._partial_sums and len(self._placement.pieces) > 1:
            return KeyedTensor(self.keys, self.dims, _Received(received, batch, self._placement))
        values = self._combine(received, batch)
        if divisor is not None:
            values = values / divisor
        return KeyedTensor(self.keys, self.dims, values)

    def _combine(self, received: torch.Tensor, batch: int) -> torch.Tensor:
        """The owners' blocks in key order: partial sums added, or one owner's one piece as it came."""
        if self._stacked:
            total = received.view(len(self._widths), batch, -1).sum(dim=0)
            return total if self.inverse is None else total.index_select(1, self.inverse)
        if self._partial_sums:
            blocks = self._placement.blocks(received, batch)
            total = received.new_zeros(batch, sum(self.dims))
            for r in self._owners:
                total = total.index_add(1, getattr(self, f"columns_{r}"), blocks[r])
            return total
        return self._placement.blocks(received, batch)[self._owners[0]]


@dataclass(frozen=True)
class _Placement:
    """Where the owners' disjoint columns go: the received buffer holds each rank's block (batch x
    its width) one after the other; the output puts every slot's columns at its key's place."""

    widths: tuple[int, ...]  # each rank's block width
    pieces: tuple[tuple[int, int, int], ...]  # (rank, first column in its block, width), in key order,
    #                                           a rank's adjacent slots that stay adjacent in key order merged
    sources: tuple[tuple[tuple[int, int], ...], ...]  # per rank, (first output column, width) in block order

    @staticmethod
    def of(slots_by_rank: Sequence[Sequence[Slot]], dims: Sequence[int]) -> _Placement:
        sources = tuple(
            tuple(zip(slot_offsets(slots, dims), (slot.shard.cols for slot in slots))) for slots in slots_by_rank
        )
        placed = []  # (first output column, rank, first column in the rank's block, width)
        for rank, rank_sources in enumerate(sources):
            first = 0
            for start, width in rank_sources:
                placed.append((start, rank, first, width))
                first += width
        pieces: list[tuple[int, int, int]] = []
        for _, rank, first, width in sorted(placed):
            if pieces and pieces[-1][0] == rank and sum(pieces[-1][1:]) == first:
                pieces[-1] = (rank, pieces[-1][1], pieces[-1][2] + width)
            else:
                pieces.append((rank, first, width))
        return _Placement(
            tuple(sum(width for _, width in rank_sources) for rank_sources in sources), tuple(pieces), sources
        )

    def blocks(self, flat: torch.Tensor, batch: int) -> list[torch.Tensor]:
        """Each rank's block of the 1-D `flat`, as a batch x width view."""
        parts = flat.split([batch * width for width in self.widths])
        return [part.view(batch, width) for part, width in zip(parts, self.widths)]

    def views(self, flat: torch.Tensor, batch: int) -> list[torch.Tensor]:
        """The pieces of the 1-D `flat`, in key order, as batch x width views."""
        blocks = self.blocks(flat, batch)
        return [blocks[r].narrow(1, first, width) for r, first, width in self.pieces]

    def scatter(self, grad: torch.Tensor, batch: int) -> torch.Tensor:
        """The inverse of concatenating `views`: `grad` (batch x all columns) in the received buffer's layout."""
        flat = grad.new_empty(batch * sum(self.widths))
        for block, rank_sources in zip(self.blocks(flat, batch), self.sources):
            if rank_sources:  # a rank's slots cover its block: one cat into it
                torch.cat([grad.narrow(1, start, width) for start, width in rank_sources], dim=1, out=block)
        return flat


@dataclass(frozen=True, eq=False)
class _Received:
    """The received buffer as the ColumnPieces of a KeyedTensor's values (runtime/sparse/jagged.py)."""

    buffer: torch.Tensor
    batch: int
    placement: _Placement

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(width for _, _, width in self.placement.pieces)

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return self.placement.views(buffer, self.batch)

    def place(self) -> torch.Tensor:
        return _Place.apply(self.buffer, self.placement, self.batch)


class _Place(torch.autograd.Function):
    """The pieces concatenated, whose backward is one `scatter`: autograd's own backward of the
    split views and their cat would copy the gradient twice (a cat per rank's block, then one of
    the blocks), 7.8 of a dlrm-bench criteo dist2 step's ~150 ms."""

    @staticmethod
    def forward(ctx: Any, received: torch.Tensor, placement: _Placement, batch: int) -> torch.Tensor:
        ctx.placement, ctx.batch = placement, batch
        return torch.cat(placement.views(received, batch), dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.placement.scatter(grad, ctx.batch), None, None
