"""Which lines each DataLoader worker parses, and which rows each rank trains on.

Two levels, both exact: every row of an epoch lands in exactly one global
batch, and the global batches are the same at every world size and number
of workers, so N ranks train exactly what one process would.

Blocks (DataLoader workers). The lines of an epoch are cut into blocks of
`block_lines` consecutive lines, numbered on across epochs; block j goes to
worker j mod W. Every worker reads the whole stream (cheap) but parses only
its own blocks (the expensive part). A DataLoader asks its workers in turn
and returns their items in that order, so blocks reach the rank in file
order.

Global batches (ranks). Global batch g is the g-th run of B consecutive good
rows (bad rows belong to no batch). Rank r of N takes the contiguous slice
[r * B/N, (r + 1) * B/N) of it. Every rank parses every row: to know where a
batch starts it must know which earlier rows were bad. Sharded embeddings
need that: their all-to-alls require every rank to bring a local batch of
the same size, so a bad row cannot simply shorten one rank's batch.

Training streams epoch after epoch (a batch may straddle two epochs), so
every batch is full. Reading one epoch (evaluation, tests) ends with a
partial batch of m < B rows: every rank then gets ceil(m / N) rows, its
share of the real rows padded with copies of the batch's first row, and
`Share.real` says how many are real.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

from runtime.data.columns import Columns
from runtime.data.errors import DataError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Share:
    """A rank's rows of one global batch; the first `real` are data, the rest padding."""

    columns: Columns
    real: int


def worker_blocks(
    epoch_lines: Callable[[], Iterable[T]],
    block_lines: int,
    worker: int,
    num_workers: int,
    epochs: int | None,
    source: str,
) -> Iterator[tuple[list[T], bool]]:
    """This worker's blocks of lines, each with whether it ends its epoch; `epochs` None: forever."""
    index = 0
    for epoch in itertools.count() if epochs is None else range(epochs):
        lines = iter(epoch_lines())
        blocks = iter(lambda: list(itertools.islice(lines, block_lines)), [])
        block = next(blocks, None)
        if block is None:
            raise DataError(f"{source}: epoch {epoch + 1} has no lines to read")
        while block is not None:
            following = next(blocks, None)
            if index % num_workers == worker:
                yield block, following is None
            index += 1
            block = following


def share_bounds(rows: int, rank: int, world_size: int) -> tuple[int, int, int]:
    """(lo, hi, size): rank's real rows [lo, hi) of a batch of `rows`, padded to `size`."""
    size = -(-rows // world_size)
    return min(rank * size, rows), min((rank + 1) * size, rows), size


def rank_shares(
    blocks: Iterable[tuple[Columns, bool]],
    global_batch: int,
    rank: int,
    world_size: int,
    *,
    last_partial: bool,
    source: str,
    on_batch: Callable[[Columns], None] | None = None,
) -> Iterator[Share]:
    """Rank's share of every global batch of the good rows of `blocks` (in order).

    `blocks` yields parsed rows with whether they end an epoch; with
    `last_partial` the rows left when `blocks` ends form a last, smaller batch.
    `on_batch` sees the whole global batch (its real rows) as the rank's share
    is taken, so every rank counts the same rows and only the batches used.
    """
    if global_batch % world_size != 0:
        raise ValueError(f"global batch size {global_batch} does not divide evenly over {world_size} ranks")
    buffer: Columns | None = None
    start = 0  # rows of `buffer` already used
    good_in_epoch = 0
    for columns, ends_epoch in blocks:
        good_in_epoch += len(columns)
        if ends_epoch:
            if good_in_epoch == 0:
                raise DataError(f"{source}: a whole epoch without one good row")
            good_in_epoch = 0
        buffer = columns if buffer is None else Columns.concat([buffer.slice(start, len(buffer)), columns])
        start = 0
        lo, hi, _ = share_bounds(global_batch, rank, world_size)
        while len(buffer) - start >= global_batch:
            if on_batch is not None:
                on_batch(buffer.slice(start, start + global_batch))
            yield Share(buffer.slice(start + lo, start + hi), hi - lo)
            start += global_batch
    if last_partial and buffer is not None and len(buffer) > start:
        batch = buffer.slice(start, len(buffer))
        if on_batch is not None:
            on_batch(batch)
        lo, hi, size = share_bounds(len(batch), rank, world_size)
        yield Share(batch.slice(lo, hi).padded(size, batch), hi - lo)
