"""Reading prepared rows by position: only the row groups a range needs, only the spec's columns.

`PreparedData` is an opened, checked prepared directory (picklable, so
DataLoader workers get it whole). `RowReader` lives in one process and turns
a range of stream positions (epoch after epoch: position p is position
p mod rows of epoch p // rows) into `Columns`, decoding each row group it
needs once while it is in use (a small cache: consecutive ranges share
their row groups) and counting what it decoded, so a test or a benchmark
can see that a rank decodes its share of the rows and none before a resume.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.config.data import ModelInputs, TimestampsConfig
from runtime.data.columns import Columns
from runtime.data.errors import DataError
from runtime.data.files.arrow import pa, pq
from runtime.data.prepared.manifest import Manifest, check_files, check_inputs, read_manifest
from runtime.data.prepared.order import EpochOrder
from runtime.data.prepared.schema import from_table
from runtime.data.spec_columns import is_weighted


@dataclass(frozen=True)
class PreparedData:
    """A prepared directory checked against a spec, and the epoch order to read it in."""

    manifest: Manifest
    specs: dict[str, dict[str, Any]]  # the columns the spec reads (the projection)
    weighted: bool
    timestamps: tuple[TimestampsConfig, ...]
    seed: int | None  # None: the prepared order
    window: int  # row groups per shuffle window

    name = "prepared"

    @property
    def source(self) -> str:
        return str(self.manifest.directory)

    @property
    def rows(self) -> int:
        return self.manifest.rows


def open_prepared(inputs: ModelInputs, path: str | Path, *, seed: int | None = None, window: int = 0) -> PreparedData:
    """The prepared data at `path` for `inputs`: finished, complete, and made for this spec's columns.

    `seed` with a `window` of row groups shuffles every epoch (runtime.data.prepared.order)."""
    manifest = read_manifest(path)
    check_files(manifest)
    specs = check_inputs(manifest, inputs)
    if seed is not None and window < 1:
        raise DataError(f"prepared data {path}: a shuffle window must be at least 1 row group, got {window}")
    return PreparedData(manifest, specs, is_weighted(inputs), inputs.timestamps, seed, window)


@dataclass
class DecodeLog:
    """Row groups decoded (global index, in decode order) and their rows, since the last `drain`."""

    groups: list[int] = field(default_factory=list)
    rows: int = 0

    def drain(self) -> DecodeLog:
        taken = DecodeLog(self.groups, self.rows)
        self.groups, self.rows = [], 0
        return taken


class RowReader:
    """Positions of the endless stream of epochs, read as `Columns` (one process's reader)."""

    def __init__(self, data: PreparedData) -> None:
        self.data = data
        self.locations = data.manifest.groups()
        self.order = EpochOrder([rows for _, _, rows in self.locations], seed=data.seed, window=data.window)
        self.columns = list(data.specs)
        self.log = DecodeLog()
        self._files: dict[int, Any] = {}
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._cache_size = max(2, data.window + 1)

    def read(self, start: int, stop: int) -> Columns:
        """Stream positions start..stop-1, which may run over from one epoch into the next."""
        rows = self.order.rows
        parts = []
        while start < stop:
            epoch, lo = divmod(start, rows)
            hi = min(rows, lo + stop - start)
            parts.append(self._epoch_rows(epoch, lo, hi))
            start += hi - lo
        return from_table(pa.concat_tables(parts), self.data.specs) if parts else self._empty()

    def _epoch_rows(self, epoch: int, lo: int, hi: int) -> pa.Table:
        selection = self.order.select(epoch, lo, hi)
        self._decode([g for g in selection.groups if g not in self._cache])
        tables = [self._group(g) for g in selection.groups]
        if selection.ranges is not None:
            return pa.concat_tables([t.slice(a, b - a) for t, (a, b) in zip(tables, selection.ranges)])
        return pa.concat_tables(tables).take(pa.array(selection.take))

    def _decode(self, groups: list[int]) -> None:
        """Decode `groups` into the cache: one read per file, not one per row group (a row group
        of a few hundred rows costs more in the call than in its rows), on this thread only
        (the rank's threads train)."""
        by_file: dict[int, list[int]] = {}
        for group in groups:
            by_file.setdefault(self.locations[group][0], []).append(group)
        for file, members in by_file.items():
            indices = [self.locations[g][1] for g in members]
            table = self._file(file).read_row_groups(indices, columns=self.columns, use_threads=False)
            start = 0
            for group in members:
                rows = self.locations[group][2]
                self._cache[group] = table.slice(start, rows)
                start += rows
                self.log.groups.append(group)
                self.log.rows += rows
        while len(self._cache) > max(self._cache_size, len(groups)):
            self._cache.popitem(last=False)

    def _group(self, group: int) -> pa.Table:
        table = self._cache.get(group)
        if table is None:
            self._decode([group])
            table = self._cache[group]
        self._cache.move_to_end(group)
        return table

    def _file(self, index: int) -> Any:
        handle = self._files.get(index)
        if handle is None:
            part = self.data.manifest.files[index]
            handle = pq.ParquetFile(self.data.manifest.directory / part.name)
            self._files[index] = handle
        return handle

    def _empty(self) -> Columns:
        return from_table(self._group(0).slice(0, 0), self.data.specs)
