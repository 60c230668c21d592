"""Prepare once: a spec's raw training files parsed into Parquet parts, resumably and atomically.

    manifest = prepare(inputs, DataChoice("criteo", "day_0.gz"), "prepared/", PrepareSettings())

The raw files are read once, in order, by the reader training would use
(runtime.data.sources: hashing of ids into tables, MovieLens vocabularies
and histories, log(1 + x) of Criteo integers). MovieLens evaluation data is
prepared with `training` (the training ratings): ids map through the
training file's vocabulary and histories start in its ratings, as
`--eval-data movielens:` reads them. Several input files (with
`workers` >= 1) are parsed one process per file, at most `workers` at once,
into hidden file parts taken in file order (runtime.data.prepared.by_file);
one file is parsed by `workers` DataLoader processes (runtime.data.loader's
blocks); `workers` 0 parses line by line in this process; without
`workers`, runtime.data.prepared.parsing chooses by the files and cores.
Whichever way, the parts are the same bytes. Bad rows are dropped
and counted, the first few named by file:line (`--bad-rows fail` stops at
the first). Good rows go, in order, into parts `part-NNNNN.parquet` of
`part_row_groups` row groups of `row_group_rows` rows (a last part may be
shorter), with the columns of runtime.data.prepared.schema.

Atomic: a part is written under a hidden name and renamed when complete;
`manifest.json` is written last (runtime.data.prepared.manifest), so a
directory without it is never read as data. Resumable: after each part a
journal (`.prepare.json`) records the parts done and where the next row
comes from: the start line of its block of lines and how many of that
block's good rows are written already. A prepare run again on the same
directory keeps those parts, skips the lines before that block unparsed,
and goes on; parts it did not record are removed. Parsed one process per
file, a block is a whole file: the journal names the file the next row
comes from, and files parsed already (their file parts) are not parsed
again. The journal also names the spec, source and settings, and another
combination is refused.

The journal and the manifest record every input file's size and
modification time (runtime.data.prepared.inputs): a prepare run again on a
directory made from an input that has changed since is refused naming the
file, never continued with, or reported as already prepared from, stale rows.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import deque
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader

from runtime.config.data import ModelInputs
from runtime.data.checks.bad_rows import BadRow, BadRowLog
from runtime.data.columns import Columns
from runtime.data.errors import DataError
from runtime.data.feature_columns import FeatureReader
from runtime.data.files.arrow import pq
from runtime.data.loader import BLOCK_LINES, Block, BlockDataset, Failure, Reader
from runtime.data.movielens.reader import MovieLensReader
from runtime.data.movielens.vocab import save_vocabulary
from runtime.data.prepared.by_file import FileParts, is_finished_file_part, raw_files
from runtime.data.prepared.inputs import input_change, input_files, input_stamps
from runtime.data.prepared.manifest import (
    MANIFEST,
    Manifest,
    PartFile,
    check_files,
    file_sha256,
    read_manifest,
    write_json_atomically,
    write_manifest,
)
from runtime.data.prepared.parsing import choose_parsing
from runtime.data.prepared.schema import column_specs, spec_digest, to_table
from runtime.data.prepared.stats import merge_stats, part_stats
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.collisions import PREPARE_ROWS, CollisionCounter, count_collisions
from runtime.data.tables.learn import learn_features, learned_configs, with_learned
from runtime.data.tables.mapping import layout_of
from runtime.features.state import FILE as FEATURES_FILE
from runtime.process.workers import loader_workers
from runtime.storage.lock import FileLock, LockHeld
from runtime.storage.manifest import sync_path
from runtime.storage.output import cannot_write

logger = logging.getLogger(__name__)

JOURNAL = ".prepare.json"
LOCK_FILE = ".prepare.lock"  # held by the running prepare (runtime/storage/lock.py)
VOCABULARY = "vocab.json"  # a MovieLens vocabulary, beside the parts
FEATURES = FEATURES_FILE  # the learned feature transforms (runtime.features), beside the parts


@dataclass(frozen=True, slots=True)
class PrepareSettings:
    """How the parts are cut and how the raw files are read."""

    row_group_rows: int = 65536
    part_row_groups: int = 8
    bad_rows: str = "skip"
    workers: int | None = None  # processes parsing (0: in this process; None: chosen, runtime.data.prepared.parsing)
    rating_threshold: float = 4.0
    block_lines: int = BLOCK_LINES
    training: str | None = None  # MovieLens evaluation data: the training ratings (vocabulary, histories)


def _open_source(inputs: ModelInputs, choice: DataChoice, settings: PrepareSettings, vocab: Path | None) -> Reader:
    """The reader of the raw data; MovieLens data saves the vocabulary its ids are mapped with at `vocab`:
    its own, or with `settings.training` the training file's (whose ratings are also the histories' past)."""
    threshold = settings.rating_threshold
    if settings.training is None:
        return open_reader(inputs, choice, threshold=threshold, vocab_path=vocab, save_vocab=True)
    if choice.reader in ("csv", "parquet"):  # the features were learned from the training files already
        return open_reader(inputs, choice)
    if choice.reader != "movielens" or vocab is None:
        raise DataError(f"--training applies to movielens data (its ids and histories), not {choice.reader}")
    training = open_reader(inputs, DataChoice("movielens", settings.training), threshold=threshold)
    trained = training.inner if isinstance(training, FeatureReader) else training
    assert isinstance(trained, MovieLensReader)
    save_vocabulary(trained.vocabulary, vocab, trained.file)
    return open_reader(
        inputs, choice, threshold=threshold, vocabulary=trained.vocabulary, training=training, held_out=True
    )


@dataclass
class _Journal:
    """What a prepare has finished: its parts, and where the rows after them come from."""

    identity: dict[str, Any]  # spec hash, source and settings: a resume must match them
    inputs: list[dict[str, Any]]  # the input files' paths, sizes and times: a resume must match them too
    parts: list[PartFile] = field(default_factory=list)
    lines: int = 0  # raw lines before the block the next row comes from
    drop: int = 0  # good rows of that block already in a part
    by_file: bool = False  # parsed one process per file: a block is a whole file
    file: int = 0  # by_file: the index of that file
    bad: int = 0  # bad rows before that block
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "inputs": self.inputs,
            "parts": [p.to_json() for p in self.parts],
            "lines": self.lines,
            "drop": self.drop,
            "by_file": self.by_file,
            "file": self.file,
            "bad": self.bad,
            "bad_examples": self.bad_examples,
            "stats": self.stats,
        }


@dataclass
class _Pending:
    """Good rows of one block of lines not yet in a part."""

    start_line: int  # raw lines before the block
    file: int  # by_file: the block's file
    columns: Columns  # its rows not yet written
    taken: int  # its rows already written
    bad_before: int  # bad rows before the block


def prepare(
    inputs: ModelInputs,
    choice: DataChoice,
    directory: str | Path,
    settings: PrepareSettings = PrepareSettings(),
    *,
    report: Callable[[str], None] | None = None,
) -> Manifest:
    """Prepare `choice`'s rows for `inputs` into `directory` (resuming a prepare stopped there).

    One prepare at a time per directory (a lock, LOCK_FILE); a full disk or a read-only folder is an
    OutputError naming the directory, the parts the journal records kept for a run again."""
    root = Path(directory)
    try:
        with _one_torch_thread(), ExitStack() as held:
            return _prepare(inputs, choice, root, settings, report, held)
    except OSError as error:
        named = None if error.filename is None else Path(error.filename)
        if named is not None and not named.absolute().is_relative_to(root.absolute()):
            raise DataError(f"cannot read {named}: {error.strerror or error}") from None
        raise cannot_write(root, error) from None


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch's ops here (columns, statistics) are small beside the parsing, and a pool of threads
    stalls on a busy core: on a loaded 2-core machine a part's statistics and columns took 1.44 s
    with 2 threads and 0.22 s with 1. The parse processes set one thread too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _prepare(
    inputs: ModelInputs,
    choice: DataChoice,
    root: Path,
    settings: PrepareSettings,
    report: Callable[[str], None] | None,
    held: ExitStack,
) -> Manifest:
    if root.exists() and not root.is_dir():
        raise DataError(f"{root}: exists and is not a directory")
    specs = column_specs(inputs)
    identity = {
        "spec_sha256": spec_digest(specs),
        "reader": choice.reader,
        "path": str(choice.path),
        "rating_threshold": settings.rating_threshold if choice.reader == "movielens" else None,
        "training": settings.training,
        "row_group_rows": settings.row_group_rows,
        "part_row_groups": settings.part_row_groups,
    }
    stamps = input_stamps(input_files(choice, settings.training))
    if (root / MANIFEST).is_file():
        return _finished(root, identity, stamps, report)
    made = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    if made:  # nothing of this run is worth keeping until the journal records a part
        held.push(lambda kind, error, trace: _remove_if_no_parts(root) if error is not None else None)
    held.callback(_lock(root).release)
    journal = _load_journal(root, identity, stamps, report)
    held.push(lambda kind, error, trace: _remove_strays_after(root, journal) if error is not None else None)
    vocab = root / VOCABULARY if choice.reader == "movielens" else None
    features, collisions = None, None
    if learned_configs(inputs):
        inputs, features, collisions = _learned(inputs, choice, settings, root, report)
    reader = _open_source(inputs, choice, settings, vocab)
    if report is not None:
        _report_features(inputs, reader, report, collisions)
    parsing = choose_parsing(len(raw_files(reader)), settings.workers, journal.by_file if journal.parts else None)
    if report is not None:
        report(f"parsing {parsing.describe()}")
    by_file = parsing.by_file
    if journal.parts and journal.by_file != by_file:
        raise DataError(
            f"{root}: holds a stopped prepare {_mode(journal.by_file)}; run it again with --workers "
            f"{'1 or more' if journal.by_file else 0} to continue it, or remove the directory"
        )
    journal.by_file = by_file
    _remove_strays(root, journal)
    writer = _PartWriter(root, specs, settings, journal)
    bad_rows = BadRowLog(settings.bad_rows, None if report is None else (lambda m: report(f"warning: {m}")))
    bad_rows.bad = journal.bad
    bad_rows.examples = [BadRow(**row) for row in journal.bad_examples]
    if by_file:
        _write_by_file(
            FileParts(reader, root, specs, settings.block_lines, settings.bad_rows == "fail", parsing.processes),
            writer,
            bad_rows,
        )
    else:
        rest = _ResumedReader(reader, journal.lines)
        if journal.lines and next(iter(rest.epoch_lines()), None) is None:
            blocks: Iterable[Block] = ()  # stopped after the last part, before the manifest
        else:
            blocks = _parsed_blocks(rest, settings, parsing.processes)
        writer.write_rows(blocks, bad_rows)
    manifest = writer.manifest(choice, bad_rows, vocab, features)
    write_manifest(manifest)
    (root / JOURNAL).unlink()
    (root / LOCK_FILE).unlink()  # finished: no prepare writes here again (released once this returns)
    return manifest


def _lock(root: Path) -> FileLock:
    try:
        return FileLock(root / LOCK_FILE)
    except LockHeld as held:
        raise DataError(
            f"{root} is in use by another prepare (pid {held.holder}, lock {held.path}); "
            "wait for it to end or choose another -o"
        ) from None


def _remove_strays_after(root: Path, journal: _Journal) -> None:
    """After a failure: the part being written goes (a run again would remove it anyway)."""
    with suppress(OSError):  # a read-only folder holds none
        _remove_strays(root, journal)


def _remove_if_no_parts(root: Path) -> None:
    """After a failure in a directory this run made: remove it unless a part is recorded to resume from."""
    with suppress(OSError):
        if not (root / JOURNAL).is_file():
            shutil.rmtree(root, ignore_errors=True)


def _report_features(
    inputs: ModelInputs, reader: Reader, report: Callable[[str], None], counted: CollisionCounter | None
) -> None:
    """What the features learned, and the collisions of the hashed ones in the first rows of the data
    (counted by the learning pass when it read this data, else by a pass of their own over those rows)."""
    if inputs.learned is not None:
        for line in inputs.learned.describe():
            report(f"learned {line}")
    if layout_of(reader) is None:
        return
    for found in counted.result() if counted is not None else count_collisions(reader, PREPARE_ROWS):
        report(f"hashed {found.describe()}")
        warning = found.warning()
        if warning is not None:
            report(f"warning: {warning}")


def _learned(
    inputs: ModelInputs,
    choice: DataChoice,
    settings: PrepareSettings,
    root: Path,
    report: Callable[[str], None] | None,
) -> tuple[ModelInputs, Path, CollisionCounter | None]:
    """`inputs` with their learned features and the file that holds them, DIR/features.json: kept from a
    stopped prepare of the same data, else learned now from the training files (`settings.training`, or
    the data itself) in one pass."""
    path = root / FEATURES
    if path.is_file():  # the journal holds this prepare to the same spec and inputs
        return with_learned(inputs, path), path, None
    if choice.reader not in ("csv", "parquet"):
        names = ", ".join(repr(name) for name in learned_configs(inputs))
        raise DataError(f"features {names} are learned from csv or parquet columns; {choice} has columns of its own")
    if settings.training is not None:
        learn_features(open_reader(inputs, DataChoice(choice.reader, settings.training)), warn=report).write(path)
        return with_learned(inputs, path), path, None
    reader = open_reader(inputs, choice)
    counter = CollisionCounter(layout_of(reader), PREPARE_ROWS)  # type: ignore[arg-type]
    learn_features(reader, collisions=counter, warn=report).write(path)
    return with_learned(inputs, path), path, counter


def _mode(by_file: bool) -> str:
    return "parsed one process per file (--workers 1 or more)" if by_file else "parsed line by line (--workers 0)"


def _write_by_file(files: FileParts, writer: _PartWriter, bad_rows: BadRowLog) -> None:
    """The files' rows, in file order, into parts; a file part goes once its rows are all in parts."""
    drop = writer.journal.drop
    with closing(files.parsed(writer.journal.file)) as parsed_files:  # a stop ends the workers at once
        for parsed in parsed_files:
            writer.add(parsed.chunks(writer.specs), parsed.lines, parsed.bad_rows, parsed.bad_count, bad_rows, drop)
            drop = 0
            files.remove_before(writer.journal.file)
    writer.flush(bad_rows)
    files.remove_before(len(files.files))


def _finished(
    root: Path, identity: dict[str, Any], inputs: list[dict[str, Any]], report: Callable[[str], None] | None
) -> Manifest:
    manifest = read_manifest(root)
    check_files(manifest)  # a part truncated or removed by hand since: not "nothing to do"
    recorded = manifest.source.get("identity")
    made = recorded if isinstance(recorded, dict) else {}  # edited by hand: not this prepare's
    if made != identity:
        raise DataError(f"{root}: already holds prepared data {_difference(made, identity)}; choose another -o")
    change = input_change(manifest.source.get("inputs"), inputs)
    if change is not None:
        raise DataError(
            f"{root}: already holds prepared data, but {change}; choose another -o, or remove "
            f"{root} to prepare it again"
        )
    if report is not None:
        report(f"{root}: already prepared ({manifest.rows:,} rows); nothing to do")
    return manifest


def _read_journal(path: Path) -> dict[str, Any]:
    """The journal's JSON object, or a DataError saying it is damaged (edited, truncated by hand)."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON
        raise _damaged(path, f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise _damaged(path, "not a JSON object")
    return data


def _damaged(path: Path, detail: str) -> DataError:
    return DataError(f"{path}: the journal of a stopped prepare is damaged ({detail}); remove the directory")


def _load_journal(
    root: Path, identity: dict[str, Any], inputs: list[dict[str, Any]], report: Callable[[str], None] | None
) -> _Journal:
    path = root / JOURNAL
    if not path.is_file():
        if any(not _ours(entry.name) for entry in root.iterdir()):
            raise DataError(f"{root}: not empty and not a prepare of this spec and data; choose another -o")
        return _Journal(identity, inputs)
    data = _read_journal(path)
    try:
        journal = _Journal(
            data["identity"],
            inputs,
            [PartFile.from_json(p) for p in data["parts"]],
            data["lines"],
            data["drop"],
            data["by_file"],
            data["file"],
            data["bad"],
            data["bad_examples"],
            data["stats"],
        )
        recorded_inputs = data.get("inputs")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise _damaged(path, f"{type(error).__name__}: {error}") from None
    if data["identity"] != identity:
        raise DataError(
            f"{root}: holds a stopped prepare {_difference(data['identity'], identity)}; "
            "choose another -o, or remove the directory"
        )
    change = input_change(recorded_inputs, inputs)
    if change is not None:
        raise DataError(f"{root}: holds a stopped prepare, but {change}; choose another -o, or remove the directory")
    for part in journal.parts:
        path = root / part.name
        if not path.is_file() or path.stat().st_size != part.bytes:
            raise DataError(
                f"{root}: part {part.name} of the stopped prepare is missing or changed; remove the directory"
            )
    if report is not None:
        rows = sum(p.rows for p in journal.parts)
        where = f"file {journal.file + 1}" if journal.by_file else f"line {journal.lines + 1:,}"
        report(
            f"resuming a stopped prepare: {len(journal.parts)} parts ({rows:,} rows) kept, "
            f"reading on from {where} of the data"
        )
    return journal


def _difference(made: dict[str, Any], wanted: dict[str, Any]) -> str:
    for key in wanted:
        if made.get(key) != wanted[key]:
            return f"with {key} {made.get(key)!r} (this prepare's: {wanted[key]!r})"
    return "of another kind"


def _remove_strays(root: Path, journal: _Journal) -> None:
    """Parts the journal does not list (written after its last update) and temporary files."""
    kept = {part.name for part in journal.parts} | {JOURNAL, VOCABULARY, FEATURES, LOCK_FILE}
    for path in root.iterdir():
        finished = journal.by_file and is_finished_file_part(path.name, root, journal.file)
        if path.name not in kept and _ours(path.name) and not finished:
            path.unlink()


def _ours(name: str) -> bool:
    """Whether a prepare writes files of this name (parts, temporary files, the journal, the vocabulary,
    the learned features)."""
    return name.startswith(".") or name.startswith("part-") or name in (VOCABULARY, FEATURES)


class _ResumedReader:
    """A reader whose lines start after the first `skip` (read, not parsed)."""

    def __init__(self, reader: Reader, skip: int) -> None:
        self.reader, self.skip = reader, skip
        self.name, self.source, self.weighted = reader.name, reader.source, reader.weighted
        self.unseen_features, self.timestamps = reader.unseen_features, reader.timestamps

    def epoch_lines(self) -> Iterator[tuple[str, int, bytes]]:
        lines = iter(self.reader.epoch_lines())
        for _ in range(self.skip):
            next(lines)
        yield from lines

    def parse(self, line: bytes) -> Any:
        return self.reader.parse(line)

    def to_columns(self, rows: list[Any]) -> Columns:
        return self.reader.to_columns(rows)


def _parsed_blocks(reader: _ResumedReader, settings: PrepareSettings, processes: int) -> Iterator[Block]:
    dataset = BlockDataset(reader, settings.block_lines, 1, stop_at_bad=settings.bad_rows == "fail")
    for block in DataLoader(dataset, batch_size=None, **loader_workers(processes)):
        if isinstance(block, Failure):
            raise DataError(block.message)
        yield block


class _PartWriter:
    """Good rows in, complete parts out, the journal updated after each."""

    def __init__(self, root: Path, specs: dict[str, dict[str, Any]], settings: PrepareSettings, journal: _Journal):
        self.root, self.specs, self.settings, self.journal = root, specs, settings, journal
        self.part_rows = settings.row_group_rows * settings.part_row_groups
        self.pending: deque[_Pending] = deque()
        self.pending_rows = 0
        self.lines = journal.lines
        self.file = journal.file
        # where the rows not yet pending come from: (start line of their block, its file, its rows
        # pending or written already, bad rows before it)
        self.next = (journal.lines, journal.file, journal.drop, journal.bad)

    def write_rows(self, blocks: Iterable[Block], bad_rows: BadRowLog) -> None:
        drop = self.journal.drop
        for block in blocks:
            self.add((block.columns,), block.lines, block.bad_rows, block.bad_count, bad_rows, drop)
            drop = 0
        self.flush(bad_rows)

    def add(
        self,
        chunks: Iterable[Columns],
        lines: int,
        examples: list[BadRow],
        bad_count: int,
        bad_rows: BadRowLog,
        drop: int,
    ) -> None:
        """One block's rows (its first `drop` in a part already), its lines and its bad rows."""
        start, file, bad_before = self.lines, self.file, bad_rows.bad
        bad_rows.count_rows(lines)
        bad_rows.add_many(examples, bad_count)
        taken = 0
        for columns in chunks:
            skip = min(drop - taken, len(columns)) if taken < drop else 0
            taken += skip
            if skip == len(columns):
                continue
            columns = columns.slice(skip, len(columns)) if skip else columns
            self.pending.append(_Pending(start, file, columns, taken, bad_before))
            self.pending_rows += len(columns)
            taken += len(columns)
            self.next = (start, file, taken, bad_before)
            while self.pending_rows >= self.part_rows:
                self._write_part(self._take(self.part_rows), bad_rows)
        self.lines += lines
        self.file += 1
        self.next = (self.lines, self.file, 0, bad_rows.bad)

    def flush(self, bad_rows: BadRowLog) -> None:
        """The last, shorter part."""
        if self.pending_rows:
            self._write_part(self._take(self.pending_rows), bad_rows)

    def manifest(self, choice: DataChoice, bad_rows: BadRowLog, vocab: Path | None, features: Path | None) -> Manifest:
        journal = self.journal
        source: dict[str, Any] = {
            "reader": choice.reader,
            "path": str(choice.path),
            "identity": journal.identity,
            "inputs": journal.inputs,
            "lines": self.lines,
            "bad_rows": bad_rows.bad,
            "bad_examples": [str(row) for row in bad_rows.examples],
        }
        if vocab is not None:
            source["vocabulary"] = {"name": vocab.name, "sha256": file_sha256(vocab)}
        if features is not None:
            source["features"] = {"name": features.name, "sha256": file_sha256(features)}
        rows = sum(part.rows for part in journal.parts)
        if rows == 0:
            raise DataError(f"{choice}: no good rows to prepare")
        columns = {name: {"spec": spec, "stats": journal.stats.get(name, {})} for name, spec in self.specs.items()}
        return Manifest(
            self.root,
            rows,
            self.settings.row_group_rows,
            journal.identity["spec_sha256"],
            columns,
            tuple(journal.parts),
            source,
        )

    def _take(self, rows: int) -> Columns:
        parts = []
        while rows:
            front = self.pending[0]
            n = min(rows, len(front.columns))
            parts.append(front.columns.slice(0, n))
            front.columns = front.columns.slice(n, len(front.columns))
            front.taken += n
            rows -= n
            self.pending_rows -= n
            if len(front.columns) == 0:
                self.pending.popleft()
        return Columns.concat(parts)

    def _write_part(self, columns: Columns, bad_rows: BadRowLog) -> None:
        journal = self.journal
        name = f"part-{len(journal.parts):05d}.parquet"
        temporary = self.root / f".{name}.tmp"
        pq.write_table(to_table(columns, self.specs), temporary, row_group_size=self.settings.row_group_rows)
        sync_path(temporary)
        path = self.root / name
        temporary.replace(path)
        full, last = divmod(len(columns), self.settings.row_group_rows)
        groups = (self.settings.row_group_rows,) * full + ((last,) if last else ())
        journal.parts.append(PartFile(name, len(columns), groups, path.stat().st_size, file_sha256(path)))
        journal.stats = merge_stats(journal.stats, part_stats(columns, self.specs))
        if self.pending:
            front = self.pending[0]
            journal.lines, journal.file, journal.drop, journal.bad = (
                front.start_line,
                front.file,
                front.taken,
                front.bad_before,
            )
        else:
            journal.lines, journal.file, journal.drop, journal.bad = self.next
        journal.bad_examples = [
            {"file": r.file, "line": r.line, "column": r.column, "value": r.value, "reason": r.reason}
            for r in bad_rows.examples
        ]
        write_json_atomically(self.root / JOURNAL, journal.to_json())
        logger.info("wrote %s (%d rows)", name, len(columns))
