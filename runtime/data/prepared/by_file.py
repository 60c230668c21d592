"""Several raw files parsed at once: one process per file, each into a hidden file part.

    files = FileParts(reader, root, specs, settings_block_lines, stop_at_bad, workers)
    for parsed in files.parsed(first):  # in file order, as each one is ready
        ...parsed.record, parsed.chunks()...

A worker parses one raw file, in blocks of lines as runtime.data.loader
does, into `.file-NNNNN.parquet` (its good rows, in order) and
`.file-NNNNN.json` (its lines, bad-row count and first bad rows), the
record written last: a file part with its record is finished, and a resumed
prepare reads it instead of parsing the file again. At most `workers` files
are parsed at a time; the prepare's process takes them in file order, so
the parts it writes are those of one process reading the files in turn.
"""

from __future__ import annotations

import copy
import json
import signal
from dataclasses import asdict, dataclass
from itertools import islice
from multiprocessing import get_context
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any, Iterator

import torch

from runtime.data.checks.bad_rows import EXAMPLES, BadRow
from runtime.data.columns import Columns
from runtime.data.errors import DataError
from runtime.data.feature_columns import FeatureReader
from runtime.data.files.arrow import pa, pq
from runtime.data.loader import Reader, parse_block
from runtime.data.prepared.manifest import write_json_atomically
from runtime.data.prepared.schema import arrow_schema, from_table, to_table
from runtime.process.lifetime import die_with_parent
from runtime.storage.manifest import sync_path

READ_ROWS = 65536  # rows of a file part turned into Columns at a time


def raw_files(reader: Reader) -> list[Path]:
    """The raw files `reader` reads in turn (one for a reader of a single file)."""
    inner = reader.inner if isinstance(reader, FeatureReader) else reader
    return list(getattr(inner, "files", ()))


def part_name(index: int) -> str:
    return f".file-{index:05d}.parquet"


def record_name(index: int) -> str:
    return f".file-{index:05d}.json"


@dataclass(frozen=True, slots=True)
class ParsedFile:
    """A raw file's parse: its file part and what its record says."""

    index: int
    path: Path  # the file part
    lines: int  # lines read, good and bad
    bad_count: int
    bad_rows: list[BadRow]  # the first few

    def chunks(self, specs: dict[str, dict[str, Any]]) -> Iterator[Columns]:
        """The file's good rows, in order, a few row groups at a time."""
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=READ_ROWS):
            yield from_table(pa.Table.from_batches([batch]), specs)


class FileParts:
    """The raw files of `reader` parsed by up to `workers` processes into file parts under `root`."""

    def __init__(
        self,
        reader: Reader,
        root: Path,
        specs: dict[str, dict[str, Any]],
        block_lines: int,
        stop_at_bad: bool,
        workers: int,
    ) -> None:
        self.reader, self.root, self.specs = reader, root, specs
        self.block_lines, self.stop_at_bad, self.workers = block_lines, stop_at_bad, workers
        self.files = raw_files(reader)

    def parsed(self, first: int) -> Iterator[ParsedFile]:
        """The files from index `first` on, in order; a file already parsed under `root` is not parsed again."""
        todo = [i for i in range(first, len(self.files)) if not (self.root / record_name(i)).is_file()]
        # Started fresh, not forked: this process runs threads (torch's, arrow's), and a child forked
        # while one of them held a lock can wait on it for ever.
        pool = get_context("spawn").Pool(max(1, min(self.workers, len(todo))), initializer=_worker_start)
        try:
            results: dict[int, AsyncResult[str | None]] = {
                i: pool.apply_async(
                    _parse_file,
                    (
                        _one_file(self.reader, self.files[i]),
                        i,
                        self.root,
                        self.specs,
                        self.block_lines,
                        self.stop_at_bad,
                    ),
                )
                for i in todo
            }
            pool.close()
            for index in range(first, len(self.files)):
                if index in results:
                    failure = results[index].get()
                    if failure is not None:
                        raise DataError(failure)
                yield self._read_record(index)
        finally:
            pool.terminate()  # a stop or an error ends the parses under way (their files are parsed again)
            pool.join()

    def remove_before(self, index: int) -> None:
        """File parts of files whose rows are all in parts already."""
        for i in range(index):
            for name in (part_name(i), record_name(i)):
                (self.root / name).unlink(missing_ok=True)

    def _read_record(self, index: int) -> ParsedFile:
        record = json.loads((self.root / record_name(index)).read_text())
        examples = [BadRow(**row) for row in record["bad_rows"]]
        return ParsedFile(index, self.root / part_name(index), record["lines"], record["bad_count"], examples)


def is_finished_file_part(name: str, root: Path, first: int) -> bool:
    """Whether `name` under `root` is a finished file part (or its record) of a file from `first` on."""
    stem = name.removesuffix(".parquet").removesuffix(".json")
    if not stem.startswith(".file-") or stem == name or not stem[6:].isdigit():
        return False
    index = int(stem[6:])
    return index >= first and (root / record_name(index)).is_file() and (root / part_name(index)).is_file()


def _one_file(reader: Reader, file: Path) -> Reader:
    """`reader` reading `file` only."""
    if isinstance(reader, FeatureReader):
        wrapped = copy.copy(reader)
        wrapped.inner = _one_file(reader.inner, file)  # type: ignore[arg-type]
        return wrapped  # type: ignore[return-value]
    single = copy.copy(reader)
    single.files = [file]  # type: ignore[attr-defined]
    return single


def _parse_file(
    reader: Reader, index: int, root: Path, specs: dict[str, dict[str, Any]], block_lines: int, stop_at_bad: bool
) -> str | None:
    """Parse the one file of `reader` into file part `index`; a DataError's message, or None."""
    temporary = root / f"{part_name(index)}.tmp"
    lines, bad_count = 0, 0
    examples: list[BadRow] = []
    try:
        with pq.ParquetWriter(temporary, arrow_schema(specs), compression="none") as out:  # read once, soon
            numbered = iter(reader.epoch_lines())
            while block := list(islice(numbered, block_lines)):
                parsed = parse_block(reader, block, False, stop_at_bad)
                lines += parsed.lines
                bad_count += parsed.bad_count
                examples += parsed.bad_rows[: EXAMPLES - len(examples)]
                out.write_table(to_table(parsed.columns, specs))
                if stop_at_bad and parsed.bad_count:
                    break
    except DataError as error:
        return str(error)
    sync_path(temporary)
    temporary.replace(root / part_name(index))
    rows = [asdict(row) for row in examples]
    write_json_atomically(root / record_name(index), {"lines": lines, "bad_count": bad_count, "bad_rows": rows})
    return None


def _worker_start() -> None:
    """A parsing process goes with the prepare's, leaves Ctrl-C to it (which ends the pool), and runs
    torch on one thread as the prepare does (runtime/data/prepared/prepare.py)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
