"""The global batch's rows on every rank: an all-gather that carries gradients back.

In-batch negatives must come from the whole global batch, not the rank's
slice, or N ranks would train a different (easier) softmax than one process.
`gather_rows` all-gathers a [b, ...] tensor into the [B, ...] global one, in
rank order; ranks may hold different numbers of rows (the last batch of an
epoch). Its backward sums every rank's gradient of the gathered tensor and
hands each rank the rows it contributed: the gradient of the sum of all
ranks' losses, which the data-parallel average then divides by the world
size, as it does for every other parameter. gloo has no reduce-scatter: the
backward sends each rank its rows' slice of the gradient in one
all_to_all_single and sums the slices it receives in rank order, one
exchange where an all-reduce (a reduce-scatter then an all-gather) takes two
and twice the bytes. It returns the input unchanged without a process group.
`gather_rows_and_ids` gathers the rows and their ids in one all-gather of
one flat byte buffer (each rank's rows' bytes beside its ids' bytes): one
wait on the slowest rank per step instead of two. Given `PaddedCounts` in place of
the counts, it also spares the counts' own exchange before it: each rank
sends its rows padded to a size every rank agrees on (the last such
gather's largest count) with its count beside them, and where a rank
held more rows than that, the gather is redone at the counts it brought.
The sizes of every exchange are known alike on every rank beforehand, as
gloo needs (a size mismatch aborts the process or truncates silently).
Every exchange is an all_to_all_single through runtime/process/shm_exchange.py
(an all-gather is one with each rank's piece sent to every rank), so ranks on
one host copy through shared memory, as the embeddings' all-to-alls do, where
gloo would move the bytes over loopback TCP on its own threads.

    >>> rows, offset = gather_rows(torch.ones(2, 3), None)
    >>> rows.shape, offset
    (torch.Size([2, 3]), 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime.process import shm_exchange

__all__ = [
    "PaddedCounts",
    "all_gather",
    "distributed",
    "gather_ids",
    "gather_rows",
    "gather_rows_and_ids",
    "row_counts",
]

COUNT_BYTES = 8  # a rank's row count, int64, in the padded gather's last row


@dataclass
class PaddedCounts:
    """Every rank's row count, learnt from `gather_rows_and_ids`' own exchange (module docstring).

    `pad`: the rows each rank sends, the same on every rank; `counts` is filled by the gather.
    """

    pad: int
    counts: list[int] | None = None


def distributed(process_group: dist.ProcessGroup | None) -> bool:
    """True when `process_group` spans more than one rank."""
    return process_group is not None and dist.get_world_size(process_group) > 1


def _device(process_group: dist.ProcessGroup) -> torch.device:
    if dist.get_backend(process_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather(tensor: torch.Tensor, process_group: dist.ProcessGroup) -> tuple[torch.Tensor, ...]:
    """Every rank's `tensor` (the same shape on every rank), in rank order: an all_to_all_single
    of equal pieces, each rank's piece its `tensor`."""
    world_size = dist.get_world_size(process_group)
    sent = tensor.contiguous().repeat(world_size, *([1] * (tensor.dim() - 1)))
    received = torch.empty_like(sent)
    shm_exchange.all_to_all_single(received, sent, None, None, group=process_group)
    return received.view(world_size, *tensor.shape).unbind(0)


def row_counts(rows: int, process_group: dist.ProcessGroup) -> list[int]:
    """Every rank's `rows`, in rank order (a collective). Pass them to the gathers of one set of
    rows: each then skips its own exchange of the counts."""
    count = torch.tensor([rows], dtype=torch.long, device=_device(process_group))
    return [int(c) for c in all_gather(count, process_group)]


def _gather(tensor: torch.Tensor, counts: list[int], process_group: dist.ProcessGroup) -> torch.Tensor:
    """All-gather rows padded to the longest rank's count, then cut back to each rank's own."""
    longest = max(counts)
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = all_gather(padded, process_group)
    return torch.cat([part[:count] for part, count in zip(parts, counts)])


def _gather_padded(message: torch.Tensor, pad: int, process_group: dist.ProcessGroup) -> tuple[torch.Tensor, list[int]]:
    """(every rank's rows of `message` [n, W] uint8 in rank order, every rank's n): one all-gather of
    `pad` rows and the count where no rank holds more than `pad`, else a second at the counts."""
    width = max(message.shape[1], COUNT_BYTES)
    padded = message.new_zeros((pad + 1, width))
    sent = min(pad, message.shape[0])
    padded[:sent, : message.shape[1]] = message[:sent]
    padded[pad, :COUNT_BYTES] = torch.tensor([message.shape[0]], dtype=torch.long).view(torch.uint8)
    parts = all_gather(padded, process_group)
    counts = torch.stack([part[pad, :COUNT_BYTES] for part in parts]).view(torch.long).reshape(-1).tolist()
    if max(counts) > pad:  # every rank knows every count now: the redo's sizes agree
        return _gather(message, counts, process_group), counts
    return torch.cat([part[:count, : message.shape[1]] for part, count in zip(parts, counts, strict=True)]), counts


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """[n, ...] as [n, bytes per row] uint8, sharing storage where it is contiguous."""
    return (
        tensor.contiguous()
        .view(torch.uint8)
        .reshape(tensor.shape[0], math.prod(tensor.shape[1:]) * tensor.element_size())
    )


def _from_bytes(raw: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The rows `_as_bytes` flattened, back as [n, *shape] of `dtype`."""
    return raw.contiguous().view(dtype).reshape(raw.shape[0], *shape)


class _GatherRowsAndIds(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, tensor: torch.Tensor, ids: torch.Tensor, counts: list[int] | PaddedCounts, rank: int, group: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = _as_bytes(tensor)
        message = torch.cat([rows, _as_bytes(ids.reshape(-1, 1))], dim=1)
        if isinstance(counts, PaddedCounts):
            raw, counts.counts = _gather_padded(message, counts.pad, group)
            counts = counts.counts
        else:
            raw = _gather(message, counts, group)
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        split = rows.shape[1]
        gathered_ids = _from_bytes(raw[:, split:], ids.dtype, ()).reshape(-1)
        ctx.mark_non_differentiable(gathered_ids)
        return _from_bytes(raw[:, :split], tensor.dtype, tuple(tensor.shape[1:])), gathered_ids

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _ids_grad: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        return _GatherRows.backward(ctx, grad)[0], None, None, None, None


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, counts: list[int], rank: int, group: Any) -> torch.Tensor:
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        return _gather(tensor, counts, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        counts, own = ctx.counts, ctx.counts[ctx.rank]
        slices = grad.new_empty((len(counts) * own, *grad.shape[1:]))
        shm_exchange.all_to_all_single(slices, grad.contiguous(), [own] * len(counts), counts, group=ctx.group)
        return slices.view(len(counts), own, *grad.shape[1:]).sum(dim=0), None, None, None


def gather_rows(
    tensor: torch.Tensor, process_group: dist.ProcessGroup | None, counts: list[int] | None = None
) -> tuple[torch.Tensor, int]:
    """(every rank's rows in rank order, the index of this rank's first row); differentiable.
    `counts`: every rank's rows (`row_counts`), when known already."""
    if not distributed(process_group):
        return tensor, 0
    device = _device(process_group)
    counts = row_counts(tensor.shape[0], process_group) if counts is None else counts
    rank = dist.get_rank(process_group)
    moved = tensor.to(device)
    gathered = _GatherRows.apply(moved, counts, rank, process_group)
    return gathered.to(tensor.device), sum(counts[:rank])


def gather_ids(
    ids: torch.Tensor, process_group: dist.ProcessGroup | None, counts: list[int] | None = None
) -> torch.Tensor:
    """Every rank's ids (1-d, lengths may differ) in rank order; no gradient. `counts` as for
    `gather_rows`."""
    if not distributed(process_group):
        return ids
    device = _device(process_group)
    counts = row_counts(ids.shape[0], process_group) if counts is None else counts
    return _gather(ids.to(device), counts, process_group).to(ids.device)


def gather_rows_and_ids(
    tensor: torch.Tensor,
    ids: torch.Tensor,
    process_group: dist.ProcessGroup | None,
    counts: list[int] | PaddedCounts | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`gather_rows(tensor)` and `gather_ids(ids)` (one id per row) in one all-gather:
    (rows, ids, the index of this rank's first row); the rows differentiable as `gather_rows`'.
    `counts`: every rank's rows when known, or `PaddedCounts` to learn them from this gather."""
    if process_group is None or not distributed(process_group):
        if isinstance(counts, PaddedCounts):
            counts.counts = [tensor.shape[0]]
        return tensor, ids, 0
    if ids.shape[0] != tensor.shape[0]:
        raise ValueError(f"gather_rows_and_ids: {ids.shape[0]} ids for {tensor.shape[0]} rows")
    device = _device(process_group)
    counts = row_counts(tensor.shape[0], process_group) if counts is None else counts
    rank = dist.get_rank(process_group)
    rows, gathered_ids = _GatherRowsAndIds.apply(tensor.to(device), ids.to(device), counts, rank, process_group)
    known = counts.counts if isinstance(counts, PaddedCounts) else counts
    assert known is not None  # the gather filled PaddedCounts in
    return rows.to(tensor.device), gathered_ids.to(ids.device), sum(known[:rank])
