"""Any table split by time into a training part and a held-out part: CSV, Parquet and Criteo rows.

`reccompile data split` of a `csv:` or `parquet:` table orders the rows by
the `time` column (numbers: unix seconds or any ordered value; ties keep
the files' order) and holds out the latest `ceil(holdout * n)` of them:
of each value of the `key` column when one is given (a user's latest
events, leaving every key at least one row to train on, as the MovieLens
split does), else of the whole table (CTR rows by time). Criteo files have
no time column, but their lines are in time order (day files in natural
order), so the latest lines of all are held out. Cutting a validation part
from a training part is the same command on the training part.

    DIR/train/NAME    the earlier rows: `train --data`
    DIR/test/NAME     the later ones: `--eval-data`

NAME is the input file's name (without a .gz suffix: the parts are
written plain) or, for a directory of files, `rows.csv` / `rows.parquet` /
`rows.txt`. CSV and Criteo lines are copied verbatim, in file order, the
CSV header first in each part; Parquet rows keep their schema. Each part is
written to a hidden temporary file and renamed into place once both are
complete, so an interrupted split leaves no part behind; as for MovieLens
(runtime.data.movielens.split.refuse_outdir) nothing is written when
DIR/train or DIR/test exists.

>>> split = split_table("csv", "events.csv", "split", time="ts", key="user", holdout=0.2)  # doctest: +SKIP
>>> split.describe()                                                                         # doctest: +SKIP
'10,000 rows of 943 keys (user) by ts: 8,115 train (split/train/events.csv), 1,885 held out (split/test/events.csv)'
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from runtime.data.errors import DataError
from runtime.data.files.text_lines import data_files, numbered_lines
from runtime.data.movielens.split import refuse_outdir

__all__ = ["SPLIT_READERS", "TableSplit", "held_out_rows", "split_table"]

SPLIT_READERS = ("movielens", "csv", "parquet", "criteo")
_DIRECTORY_NAMES = {"csv": "rows.csv", "parquet": "rows.parquet", "criteo": "rows.txt"}


@dataclass(frozen=True, slots=True)
class TableSplit:
    """What `split_table` wrote, and the counts it prints."""

    train: Path
    test: Path
    rows: int
    train_rows: int
    test_rows: int
    order: str  # what the rows were ordered by
    keys: int | None = None  # distinct values of the key column, when split per key
    key: str | None = None

    def describe(self) -> str:
        of = "" if self.key is None else f" of {self.keys:,} keys ({self.key})"
        return (
            f"{self.rows:,} rows{of} by {self.order}: {self.train_rows:,} train ({self.train}), "
            f"{self.test_rows:,} held out ({self.test})"
        )


def held_out_rows(keys: torch.Tensor, times: torch.Tensor, holdout: float) -> torch.Tensor:
    """[n] bool: the rows held out, the latest `ceil(holdout * m)` of each key's m rows (at most
    m - 1) by (time, row number).

    >>> held_out_rows(torch.tensor([0, 0, 0, 1, 1]), torch.tensor([3.0, 1.0, 2.0, 5.0, 5.0]), 0.5).tolist()
    [True, False, True, False, True]
    """
    n = keys.numel()
    rows = torch.arange(n)
    order = rows[torch.argsort(times, stable=True)]
    order = order[torch.argsort(keys[order], stable=True)]  # by key, then time, then row number
    sorted_keys = keys[order]
    counts = torch.bincount(sorted_keys)
    starts = torch.cumsum(counts, 0) - counts
    rank = rows - starts[sorted_keys]  # the position within the key, oldest first
    size = counts[sorted_keys]
    kept = size - torch.minimum(size - 1, torch.ceil(holdout * size.double()).long())
    held = torch.zeros(n, dtype=torch.bool)
    held[order] = rank >= kept
    return held


def split_table(
    reader: str, path: str | Path, outdir: str | Path, *, time: str | None, key: str | None, holdout: float
) -> TableSplit:
    """Split the rows of `reader:path` into `outdir`/train and `outdir`/test (see the module)."""
    if not 0.0 < holdout < 1.0:
        raise DataError(f"holdout must be between 0 and 1 (exclusive), got {holdout:g}")
    if reader not in ("csv", "parquet", "criteo"):
        raise DataError(f"{reader}:{path}: split reads {', '.join(SPLIT_READERS)} data")
    if reader == "criteo" and (time is not None or key is not None):
        raise DataError("criteo lines have no time or key column: they are in time order, and the latest are held out")
    if reader != "criteo" and time is None:
        raise DataError(f"{reader}:{path}: name the column the rows are ordered by (--time COLUMN)")
    files = data_files(path)
    root = Path(outdir)
    refuse_outdir(root, files)
    name = _DIRECTORY_NAMES[reader] if Path(path).is_dir() else files[0].name.removesuffix(".gz")
    if reader == "parquet":
        return _split_parquet(files, root, name, time, key, holdout)
    if reader == "csv":
        header, keys, times, where = _csv_columns(files, time, key)
    else:
        header, where = None, [(file, number) for file in files for number, _ in numbered_lines(file)]
        keys, times = None, torch.arange(len(where), dtype=torch.float64)
    if not where:
        raise DataError(f"{path}: no data lines to split")
    codes, distinct = _codes(keys, len(where))
    held = held_out_rows(codes, times, holdout)
    train, test = root / "train" / name, root / "test" / name
    _write_parts(train, test, header, _lines(files, header is not None), held)
    return TableSplit(
        train,
        test,
        len(where),
        len(where) - int(held.sum()),
        int(held.sum()),
        time if time is not None else "line order (criteo lines are in time order)",
        distinct if key is not None else None,
        key,
    )


def _codes(keys: list[Any] | None, n: int) -> tuple[torch.Tensor, int]:
    """Each row's key as a number from 0, and how many keys; one key for all rows without a key column."""
    if keys is None:
        return torch.zeros(n, dtype=torch.long), 1
    numbers: dict[Any, int] = {}
    codes = torch.tensor([numbers.setdefault(value, len(numbers)) for value in keys], dtype=torch.long)
    return codes, len(numbers)


def _csv_columns(
    files: list[Path], time: str, key: str | None
) -> tuple[bytes, list[str] | None, torch.Tensor, list[tuple[Path, int]]]:
    """The header line, each row's key and time, and where each row is; DataError names file:line."""
    header: bytes | None = None
    keys: list[str] = []
    times: list[float] = []
    where: list[tuple[Path, int]] = []
    for file in files:
        lines = numbered_lines(file)
        first = next(lines, None)
        if first is None:
            raise DataError(f"{file}: empty, expected a header line naming the columns")
        if header is None:
            header = first[1]
        elif first[1] != header:
            raise DataError(f"{file}:1: the header differs from {files[0]}'s")
        delimiter = "\t" if b"\t" in header else ","
        names = _fields(header, delimiter, file, 1)
        for column in (time, key):
            if column is not None and column not in names:
                raise DataError(f"{file}:1: the header has no column {column!r}")
        time_at = names.index(time)
        key_at = None if key is None else names.index(key)
        for number, line in lines:
            if not line.strip():
                continue
            fields = _fields(line, delimiter, file, number)
            if len(fields) != len(names):
                raise DataError(f"{file}:{number}: {len(fields)} fields, the header names {len(names)}")
            try:
                times.append(float(fields[time_at]))
            except ValueError:
                raise DataError(f"{file}:{number}: column {time!r} ({fields[time_at]!r}): not a number") from None
            if not math.isfinite(times[-1]):
                raise DataError(f"{file}:{number}: column {time!r} ({fields[time_at]!r}): not a finite number")
            if key_at is not None:
                keys.append(fields[key_at])
            where.append((file, number))
    assert header is not None
    return header, None if key is None else keys, torch.tensor(times, dtype=torch.float64), where


def _fields(line: bytes, delimiter: str, file: Path, number: int) -> list[str]:
    try:
        return next(csv.reader([line.decode("utf-8")], delimiter=delimiter, strict=True))
    except (UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{file}:{number}: not a CSV line ({error})") from None


def _lines(files: list[Path], has_header: bool) -> Iterator[bytes]:
    """Every data line of `files` in order, as `_csv_columns` counted them (blank lines skipped)."""
    for file in files:
        for _, line in numbered_lines(file, skip=1 if has_header else 0):
            if not has_header or line.strip():
                yield line


def _write_parts(train: Path, test: Path, header: bytes | None, lines: Iterator[bytes], held: torch.Tensor) -> None:
    """The lines into `train` and `test` by `held`, each through a temporary file renamed at the end."""

    def write(streams: dict[bool, Any]) -> None:
        for stream in streams.values():
            if header is not None:
                stream.write(header + b"\n")
        for line, out in zip(lines, held.tolist()):
            streams[out].write(line + b"\n")

    _atomically((train, test), lambda temporaries: _with_streams(temporaries, write))


def _with_streams(paths: tuple[Path, Path], write: Callable[[dict[bool, Any]], None]) -> None:
    with open(paths[0], "wb") as train, open(paths[1], "wb") as test:
        write({False: train, True: test})


def _atomically(paths: tuple[Path, Path], write: Callable[[tuple[Path, Path]], None]) -> None:
    """`write` into hidden temporaries of `paths`, renamed into place only once both are complete."""
    temporaries = tuple(path.with_name(f".{path.name}.tmp") for path in paths)
    created = [path.parent for path in paths if not path.parent.exists()]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(temporaries)  # type: ignore[arg-type]
    except BaseException:
        for temporary in temporaries:
            temporary.unlink(missing_ok=True)
        for folder in created:
            folder.rmdir()
        raise
    for temporary, path in zip(temporaries, paths):
        temporary.replace(path)


def _split_parquet(
    files: list[Path], root: Path, name: str, time: str | None, key: str | None, holdout: float
) -> TableSplit:
    import pyarrow.compute as pc

    from runtime.data.files.arrow import pa, pq

    tables = []
    for file in files:
        try:
            tables.append(pq.read_table(file))
        except (OSError, pa.ArrowException) as error:
            raise DataError(f"{file}: not a readable Parquet file ({error})") from None
        for column in (time, key):
            if column is not None and column not in tables[-1].column_names:
                raise DataError(f"{file}: no column {column!r}")
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowException as error:
        raise DataError(f"{files[0]}: the files' schemas differ ({error})") from None
    if table.num_rows == 0:
        raise DataError(f"{files[0]}: no rows to split")
    times = _parquet_times(table, time, files[0])
    keys = None if key is None else table.column(key).to_pylist()
    codes, distinct = _codes(keys, table.num_rows)
    held = held_out_rows(codes, times, holdout)
    train, test = root / "train" / name, root / "test" / name
    mask = pa.array(held.numpy())

    def write(temporaries: tuple[Path, Path]) -> None:
        pq.write_table(table.filter(pc.invert(mask)), temporaries[0])
        pq.write_table(table.filter(mask), temporaries[1])

    _atomically((train, test), write)
    count = int(held.sum())
    return TableSplit(
        train,
        test,
        table.num_rows,
        table.num_rows - count,
        count,
        str(time),
        distinct if key is not None else None,
        key,
    )


def _parquet_times(table: Any, time: str | None, file: Path) -> torch.Tensor:
    """The time column as float64 (timestamps as their integer value); DataError for another type or a null."""
    from runtime.data.files.arrow import pa

    column = table.column(time)
    kind = column.type
    if pa.types.is_timestamp(kind):
        column = column.cast(pa.int64())
    elif not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise DataError(f"{file}: column {time!r} is {kind}, not a number or a timestamp")
    if column.null_count:
        raise DataError(f"{file}: column {time!r} has {column.null_count:,} empty values")
    return torch.from_numpy(column.to_numpy().astype("float64"))
