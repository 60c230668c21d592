"""File readers as batch streams: DataLoader workers parse, the rank cuts its batches.

A `Reader` (Criteo, MovieLens) says how to list the lines of an epoch, parse
one line and turn parsed rows into `Columns`. `BlockDataset` runs in
DataLoader worker processes: each worker parses its blocks of lines into
tensors and reports their bad rows. In the rank's own process the blocks are
joined in file order, the bad rows are counted (or stop the run), and
`runtime.data.rank_slices.rank_shares` cuts the rank's share of each global batch,
which becomes a `Batch` with a `KeyedJaggedTensor`.

    training_batches(reader, ...)  -> Batch, forever (epoch after epoch)
    epoch_batches(reader, ...)     -> LocalBatch, one epoch (evaluation)

Bad rows are counted in the first epoch only (runtime.data.checks.bad_rows), and
training calls `on_wrap(pass, step)` when it reads the data again from its
beginning: `pass` 2, 3, ..., `step` the step whose batch holds the end of the
pass before (a batch may straddle two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from runtime.config.data import TimestampsConfig
from runtime.data.batch import Batch
from runtime.data.checks.bad_rows import EXAMPLES, BadRow, BadRowLog
from runtime.data.checks.timestamps import check_timestamps
from runtime.data.checks.unseen_ids import UnseenIds
from runtime.data.columns import Columns
from runtime.data.errors import DataError, RowError
from runtime.data.rank_slices import Share, rank_shares, worker_blocks
from runtime.process.lifetime import die_with_parent
from runtime.process.workers import worker_context

BLOCK_LINES = 4096


class Reader(Protocol):
    """What a file format gives the loader."""

    name: str  # the reader's name: criteo, movielens
    source: str  # the path it reads, for messages
    weighted: bool  # whether batches carry per-id weights
    unseen_features: tuple[str, ...]  # features whose row 0 takes unseen ids (runtime.data.checks.unseen_ids)
    timestamps: tuple[TimestampsConfig, ...]  # the timestamps features its batches carry

    def epoch_lines(self) -> Iterable[tuple[str, int, bytes]]:
        """(file, line number, line) of every data line of one epoch, in order."""
        ...

    def parse(self, line: bytes) -> Any:
        """One line's values; raises RowError naming the column, value and reason."""
        ...

    def to_columns(self, rows: list[Any]) -> Columns:
        """Parsed rows as feature and label tensors, sparse features in the spec's order."""
        ...


@dataclass(frozen=True, slots=True)
class Block:
    """A worker's parse of one block of lines."""

    columns: Columns  # the good rows
    lines: int  # lines read, good and bad
    bad_rows: list[BadRow]  # the first few bad rows
    bad_count: int
    ends_epoch: bool


@dataclass(frozen=True, slots=True)
class LocalBatch:
    """A rank's batch of one epoch's reading; samples past `real` pad the last batch."""

    batch: Batch
    real: int


class BlockDataset(IterableDataset):
    """The blocks of this DataLoader worker, parsed (see `runtime.data.rank_slices.worker_blocks`)."""

    def __init__(self, reader: Reader, block_lines: int, epochs: int | None, stop_at_bad: bool) -> None:
        super().__init__()
        self.reader = reader
        self.block_lines = block_lines
        self.epochs = epochs
        self.stop_at_bad = stop_at_bad

    def __iter__(self) -> Iterator[Block | Failure]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        blocks = worker_blocks(
            self.reader.epoch_lines, self.block_lines, worker, workers, self.epochs, self.reader.source
        )
        try:
            for lines, ends_epoch in blocks:
                yield parse_block(self.reader, lines, ends_epoch, self.stop_at_bad)
        except DataError as error:  # handed over as data: DataLoader would re-raise it with its traceback
            yield Failure(str(error))


@dataclass(frozen=True, slots=True)
class Failure:
    """A DataError in a DataLoader worker, raised again as a DataError where the blocks are read."""

    message: str


def parse_block(reader: Reader, lines: list[tuple[str, int, bytes]], ends_epoch: bool, stop_at_bad: bool) -> Block:
    """Parse `lines`; with `stop_at_bad`, stop at the first bad one (the run fails on it)."""
    rows, bad_rows, bad_count = [], [], 0
    for file, number, line in lines:
        try:
            rows.append(reader.parse(line))
        except RowError as error:
            bad_count += 1
            if len(bad_rows) < EXAMPLES:
                bad_rows.append(BadRow.from_error(file, number, error))
            if stop_at_bad:
                break
    return Block(reader.to_columns(rows), len(lines), bad_rows, bad_count, ends_epoch)


def training_batches(
    reader: Reader,
    *,
    global_batch: int,
    rank: int,
    world_size: int,
    bad_rows: BadRowLog,
    num_workers: int = 1,
    block_lines: int = BLOCK_LINES,
    unseen: UnseenIds | None = None,
    on_wrap: Callable[[int, int], None] | None = None,
) -> Iterator[Batch]:
    """Rank's share of every global batch, epoch after epoch, forever; `unseen` counts each batch taken,
    `on_wrap(pass, step)` hears of every new pass (see the module)."""
    shares = _shares(reader, global_batch, rank, world_size, bad_rows, num_workers, block_lines, None, unseen, on_wrap)
    for share in shares:
        yield _batch(reader, share)


def epoch_batches(
    reader: Reader,
    *,
    global_batch: int,
    rank: int,
    world_size: int,
    bad_rows: BadRowLog,
    num_workers: int = 1,
    block_lines: int = BLOCK_LINES,
    unseen: UnseenIds | None = None,
) -> Iterator[LocalBatch]:
    """Rank's share of every global batch of one epoch; the last may be padded (see `LocalBatch`).

    `unseen` counts the real rows of each batch taken."""
    shares = _shares(reader, global_batch, rank, world_size, bad_rows, num_workers, block_lines, 1, unseen)
    for share in shares:
        yield LocalBatch(_batch(reader, share), share.real)


def _batch(reader: Reader, share: Share) -> Batch:
    batch = share.columns.to_batch(reader.weighted)
    check_timestamps(batch.sparse, reader.timestamps)
    return batch


def _shares(
    reader: Reader,
    global_batch: int,
    rank: int,
    world_size: int,
    bad_rows: BadRowLog,
    num_workers: int,
    block_lines: int,
    epochs: int | None,
    unseen: UnseenIds | None,
    on_wrap: Callable[[int, int], None] | None = None,
) -> Iterator[Share]:
    dataset = BlockDataset(reader, block_lines, epochs, stop_at_bad=bad_rows.policy == "fail")
    # a worker outlives a SIGKILLed rank only to print its fd-passing thread's traceback
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        worker_init_fn=_die_with_rank,
        multiprocessing_context=worker_context(num_workers),
    )

    def blocks() -> Iterator[tuple[Columns, bool]]:
        good, passes, ended = 0, 1, False
        for block in loader:
            if isinstance(block, Failure):
                raise DataError(block.message)
            if ended:  # told only now: a run that ends within the last pass reads no block of the next
                passes += 1
                if on_wrap is not None:
                    on_wrap(passes, -(-good // global_batch))
            bad_rows.count_rows(block.lines)
            bad_rows.add_many(block.bad_rows, block.bad_count)
            good += len(block.columns)
            ended = block.ends_epoch
            if ended:
                bad_rows.end_pass()
            yield block.columns, block.ends_epoch

    yield from rank_shares(
        blocks(),
        global_batch,
        rank,
        world_size,
        last_partial=epochs is not None,
        source=reader.source,
        on_batch=None if unseen is None else unseen.add,
    )


def _die_with_rank(worker: int) -> None:
    die_with_parent()
