"""A rank's share of every global batch of prepared data, read in DataLoader workers.

Global batch g is stream positions [g * B, (g + 1) * B) (runtime.data.prepared.reading:
epoch after epoch, in the prepared order or each epoch's shuffle), and rank
r of N trains its contiguous slice [r * B/N, (r + 1) * B/N) of it, as the
file readers' ranks do (runtime.data.rank_slices), so N ranks train exactly
what one process would. Unlike a file reader's, a rank reads only its
slice: the row groups it touches and the spec's columns, so its reading
cost is rows / N.

Batches are dealt to the DataLoader's workers in chunks of consecutive
batches (about a row group's worth: consecutive slices share row groups,
which each worker then decodes once); a DataLoader takes one item from
each worker in turn, so chunks come back in order.

Where decoding falls as 1/N, and where not: Parquet is decoded a row group
at a time (pyarrow reads a group's column chunks from their first page; it
has no reader of a row range within a group, and a shuffled slice would need
scattered rows of every page anyway). So a rank decodes exactly its rows when
its slices are whole row groups: in the prepared order, when the row group
rows G divide B/N; shuffled with a window of K groups, when B/N is a multiple
of the window's K·G rows (a slice is then whole windows). Otherwise a group
is decoded by every rank whose slice touches it: in the prepared order at
most two groups more per batch than its share (at G >= B/N, prepare's default
65536 with small batches, every rank decodes every row, once, from its
cache); shuffled, every rank decodes every group of every window it reads
in. Cutting global batches differently would make the rows a rank trains
depend on N, which the exactness above rules out.

The data position is a row: `state_after(step)` is the position after
`step` global batches, which a checkpoint keeps; `load_state_dict` before
the first batch starts there, and no row group before it is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from runtime.data.batch import Batch
from runtime.data.checks.timestamps import check_timestamps
from runtime.data.errors import DataError
from runtime.data.files.arrow import pa
from runtime.data.loader import Failure, LocalBatch
from runtime.data.prepared.reading import DecodeLog, PreparedData, RowReader
from runtime.data.rank_slices import Share, share_bounds
from runtime.process.lifetime import die_with_parent
from runtime.process.workers import worker_context


@dataclass(frozen=True)
class Chunk:
    """A worker's shares of consecutive global batches, as batches, and what it decoded to read them."""

    batches: list[LocalBatch]
    decoded: DecodeLog


class ShareDataset(IterableDataset):
    """Rank's shares of global batches `first`, `first` + 1, ... (forever, or to the end of one epoch)."""

    def __init__(
        self, data: PreparedData, global_batch: int, rank: int, world_size: int, first: int, one_epoch: bool
    ) -> None:
        super().__init__()
        if global_batch % world_size != 0:
            raise ValueError(f"global batch size {global_batch} does not divide evenly over {world_size} ranks")
        self.data, self.global_batch, self.rank, self.world_size = data, global_batch, rank, world_size
        self.first, self.one_epoch = first, one_epoch
        group_rows = max(data.manifest.row_group_rows, 1) * max(data.window, 1)
        self.chunk = max(1, group_rows // global_batch)

    def __iter__(self) -> Iterator[Chunk | Failure]:
        try:
            yield from self._chunks()
        except (DataError, OSError, pa.ArrowException) as error:  # handed over as data, as the file readers do
            yield Failure(f"prepared data {self.data.source}: {error}")

    def _chunks(self) -> Iterator[Chunk]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        reader = RowReader(self.data)
        batches = -(-self.data.rows // self.global_batch) if self.one_epoch else None
        k = worker
        while True:
            start = self.first + k * self.chunk
            stop = start + self.chunk if batches is None else min(start + self.chunk, batches)
            if start >= stop:
                return
            yield Chunk([_batch(self.data, self._share(reader, g)) for g in range(start, stop)], reader.log.drain())
            k += workers

    def _share(self, reader: RowReader, g: int) -> Share:
        begin = g * self.global_batch
        rows = self.global_batch if not self.one_epoch else min(self.global_batch, self.data.rows - begin)
        lo, hi, size = share_bounds(rows, self.rank, self.world_size)
        columns = reader.read(begin + lo, begin + hi)
        if hi - lo < size:  # the last batch of an epoch: padded with its first row, as runtime.data.rank_slices does
            filler = columns if lo == 0 else reader.read(begin, begin + 1)
            columns = columns.padded(size, filler)
        return Share(columns, hi - lo)


class PreparedBatches:
    """The rank's batches of prepared data, forever; resumable at a row (see the module docstring)."""

    def __init__(
        self,
        data: PreparedData,
        *,
        global_batch: int,
        rank: int,
        world_size: int,
        num_workers: int = 1,
        on_wrap: Callable[[int, int], None] | None = None,
    ) -> None:
        self.data, self.global_batch, self.rank, self.world_size = data, global_batch, rank, world_size
        self.num_workers = num_workers
        self.on_wrap = on_wrap  # (pass, step): a batch reads the data again from its beginning (as loader's)
        self.first = 0  # the global batch to start at
        self.taken = 0  # batches taken since `first`
        self.decoded = DecodeLog()  # everything this rank's workers decoded
        self._chunks: Iterator[Chunk] | None = None
        self._batches: list[LocalBatch] = []

    def state_after(self, step: int) -> dict[str, Any]:
        """The data position after `step` global batches: what a checkpoint keeps."""
        return {
            "reader": "prepared",
            "row": step * self.global_batch,
            "seed": self.data.seed,
            "window": self.data.window,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start at a position `state_after` gave (before the first batch is taken)."""
        if self._chunks is not None:
            raise RuntimeError("the data position is set before the first batch is taken")
        if state.get("reader") != "prepared":
            raise DataError(
                f"the checkpoint's data position is for the {state.get('reader')} reader, not prepared data"
            )
        saved, window = state.get("window") or 0, self.data.window or 0
        if saved != window:
            raise DataError(
                f"the checkpoint read prepared data with --shuffle-window {saved}, this run with {window}: "
                f"resume with --shuffle-window {saved} to continue its order"
            )
        if window and state.get("seed") != self.data.seed:  # the seed orders shuffled data only
            raise DataError(
                f"the checkpoint read prepared data shuffled with --seed {state.get('seed')}, this run with "
                f"{self.data.seed}: resume with --seed {state.get('seed')} to continue its order"
            )
        row = int(state["row"])
        if row % self.global_batch != 0:
            raise DataError(f"the checkpoint's data position, row {row}, is not at a batch of {self.global_batch}")
        self.first = row // self.global_batch

    def __iter__(self) -> PreparedBatches:
        return self

    def __next__(self) -> Batch:
        if not self._batches:
            if self._chunks is None:
                self._chunks = _chunks(
                    self.data, self.global_batch, self.rank, self.world_size, self.first, False, self.num_workers
                )
            chunk = next(self._chunks)
            self.decoded.groups += chunk.decoded.groups
            self.decoded.rows += chunk.decoded.rows
            self._batches = list(chunk.batches)
        g, rows, size = self.first + self.taken, self.data.rows, self.global_batch
        self.taken += 1
        if self.on_wrap is not None:
            for ended in range(max(g * size - 1, 0) // rows + 1, ((g + 1) * size - 1) // rows + 1):
                self.on_wrap(ended + 1, -(-ended * rows // size))
        return self._batches.pop(0).batch

    def close(self) -> None:
        """Stop the DataLoader workers now."""
        if self._chunks is not None:
            self._chunks.close()  # type: ignore[attr-defined]
            self._chunks = None


def prepared_epoch_batches(
    data: PreparedData, *, global_batch: int, rank: int, world_size: int, num_workers: int = 1
) -> Iterator[LocalBatch]:
    """Rank's share of every global batch of one epoch; the last may be padded (evaluation)."""
    for chunk in _chunks(data, global_batch, rank, world_size, 0, True, num_workers):
        yield from chunk.batches


def _chunks(
    data: PreparedData, global_batch: int, rank: int, world_size: int, first: int, one_epoch: bool, workers: int
) -> Iterator[Chunk]:
    dataset = ShareDataset(data, global_batch, rank, world_size, first, one_epoch)
    # a worker outlives a SIGKILLed rank only to print its fd-passing thread's traceback
    for chunk in DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        worker_init_fn=_die_with_rank,
        multiprocessing_context=worker_context(workers),
    ):
        if isinstance(chunk, Failure):
            raise DataError(chunk.message)
        yield chunk


def _batch(data: PreparedData, share: Share) -> LocalBatch:
    """The share as the batch the model takes, made where it was read: a DataLoader worker
    hands over the batch's few joined tensors, not every column's."""
    batch = share.columns.to_batch(data.weighted)
    check_timestamps(batch.sparse, data.timestamps)
    return LocalBatch(batch, share.real)


def _die_with_rank(worker: int) -> None:
    die_with_parent()
