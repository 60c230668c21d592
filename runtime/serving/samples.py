"""What `predict` and `retrieve` read: synthetic samples or a data file's lines, in keyed batches.

    samples = open_samples(module.INPUTS, "movielens:ratings.csv", batch_size=512, vocabulary=vocab_json)
    for keys, batch in samples.batches:   # keys: [[file, line], ...] ([[0], [1], ...] for synthetic)
        ...
    samples.bad_rows.summary(), samples.unseen.describe()

`synthetic` is the spec's synthetic batches (runtime.data.synthetic.batches), ids
counted from 0; any other `data` is a file read by the reader training
would use (runtime.data.sources), line by line in file order so each row
keeps its file and line, bad rows under the training rule
(runtime.data.checks.bad_rows) and MovieLens ids mapped with the vocabulary
training saved (an export's vocab.json), those outside it counted
(runtime.data.checks.unseen_ids). `history` (a next-item model's requests): the
training data each request's history is cut from, as evaluation cuts it
(runtime.data.movielens.history); without it a request's history is the
earlier lines of its own file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from runtime.config.data import ModelInputs
from runtime.data.batch import Batch
from runtime.data.checks.bad_rows import BadRow, BadRowLog
from runtime.data.checks.unseen_ids import UnseenIds, unseen_counter
from runtime.data.errors import RowError
from runtime.data.movielens.vocab import Vocabulary, read_vocabulary
from runtime.data.synthetic.batches import make_batch
from runtime.data.tables.learn import with_learned

__all__ = ["Keyed", "Samples", "file_samples", "open_samples", "requests_reader", "synthetic_samples"]

# (row ids, batch): ids are [sample number] for synthetic data, [file, line] for files.
Keyed = tuple[list[list[Any]], Batch]


@dataclass(frozen=True)
class Samples:
    """Keyed batches, the CSV columns of their keys, and (a file's) bad rows and unseen ids."""

    batches: Iterator[Keyed]
    id_columns: list[str]
    bad_rows: BadRowLog | None = None
    unseen: UnseenIds | None = None

    @property
    def bad_count(self) -> int:
        return 0 if self.bad_rows is None else self.bad_rows.bad

    @property
    def bad_rows_summary(self) -> str | None:
        return None if self.bad_rows is None else self.bad_rows.summary()


def open_samples(
    inputs: ModelInputs,
    data: str,
    *,
    batch_size: int,
    rows: int = 0,
    seed: int = 0,
    bad_rows_policy: str = "fail",
    warn: Any = None,
    vocabulary: Path | None = None,
    threshold: float = 4.0,
    positives: bool = True,
    features: Path | None = None,
    history: str | None = None,
) -> Samples:
    """`data`'s samples in batches of `batch_size` (`rows` of them for synthetic, from `seed`).

    `vocabulary`: the saved MovieLens vocabulary (without it ids map through
    one built from `data`); `threshold`, `positives` and `history` as for
    `requests_reader`. `features`: the learned feature state training saved
    (an export's features.json), applied to the raw fields; a spec with
    learned transforms and no such file is a DataError, never relearned."""
    if features is not None:
        inputs = with_learned(inputs, features)
    if data == "synthetic":
        return Samples(synthetic_samples(inputs, batch_size, rows, seed), ["id"])
    known = None if vocabulary is None else read_vocabulary(vocabulary)
    reader = requests_reader(inputs, data, known, threshold, positives, history)
    log, unseen = BadRowLog(bad_rows_policy, warn), unseen_counter(reader)
    return Samples(file_samples(reader, batch_size, log, unseen), ["file", "line"], log, unseen)


def requests_reader(
    inputs: ModelInputs,
    data: str,
    vocabulary: Vocabulary | None,
    threshold: float = 4.0,
    positives: bool = False,
    history: str | None = None,
) -> Any:
    """The reader of a requests file: every line a request, or with `positives` (held-out data)
    a MovieLens file's ratings >= `threshold` only, as training read them; `history`: the
    training data whose ratings are the requests' past (`movielens:FILE`)."""
    from runtime.data.errors import DataError
    from runtime.data.sources import choose_data, open_reader

    training = None
    if history is not None:
        choice = choose_data(history, inputs)
        if choice.reader != "movielens":
            raise DataError(
                f"--history {history}: the histories of requests come from MovieLens ratings "
                "(movielens:FILE), the training data the requests were split from"
            )
        training = open_reader(inputs, choice, threshold=threshold, vocabulary=vocabulary)
    reader = open_reader(
        inputs, choose_data(data, inputs), threshold=threshold, vocabulary=vocabulary, training=training, requests=True
    )
    if training is not None and getattr(getattr(reader, "inner", reader), "histories", None) is None:
        raise DataError(f"--history {history}: the requests of {data} have no history feature to cut from it")
    if not positives and hasattr(reader, "positives_only"):
        reader.positives_only = False
    return reader


def synthetic_samples(inputs: ModelInputs, batch_size: int, rows: int, seed: int) -> Iterator[Keyed]:
    """`rows` samples of the spec's synthetic data, ids counted from 0."""
    done, step = 0, 0
    while done < rows:
        size = min(batch_size, rows - done)
        yield [[done + i] for i in range(size)], make_batch(inputs, size, step, seed)
        done += size
        step += 1


def file_samples(reader: Any, batch_size: int, bad_rows: BadRowLog, unseen: UnseenIds | None = None) -> Iterator[Keyed]:
    """The good lines of `reader` (a runtime.data.loader.Reader) in batches, with file and line;
    `unseen` counts the ids of every batch outside the vocabulary."""
    rows: list[Any] = []
    where: list[list[Any]] = []
    for file, number, line in reader.epoch_lines():
        bad_rows.count_rows(1)
        try:
            rows.append(reader.parse(line))
        except RowError as error:
            bad_rows.add(BadRow.from_error(file, number, error))
            continue
        where.append([file, number])
        if len(rows) == batch_size:
            yield where, _batch(reader, rows, unseen)
            rows, where = [], []
    if rows:
        yield where, _batch(reader, rows, unseen)


def _batch(reader: Any, rows: list[Any], unseen: UnseenIds | None) -> Batch:
    columns = reader.to_columns(rows)
    if unseen is not None:
        unseen.add(columns)
    return columns.to_batch(reader.weighted)
