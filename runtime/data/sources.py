"""Choosing the data: `--data` and the spec's `data:` section, to a reader.

    synthetic          batches made from the spec (the generated module's synthetic_batch)
    criteo:PATH        Criteo TSV files (runtime.data.criteo.reader)
    movielens:PATH     MovieLens ratings (runtime.data.movielens.reader)
    csv:PATH           CSV files whose columns data.columns maps (runtime.data.tables)
    parquet:PATH       Parquet files whose columns data.columns maps (runtime.data.tables)
    prepared:DIR       rows prepared once into Parquet (runtime.data.prepared), read by rank
    PATH               the reader the spec's `data:` section names

Without `--data`, the spec's `data:` section decides, and without one the
data is synthetic. A relative path is relative to the working directory.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from runtime.config.data import ModelInputs
from runtime.data.criteo.reader import CriteoReader
from runtime.data.errors import DataError
from runtime.data.feature_columns import FeatureReader, derives, read_inputs
from runtime.data.loader import Reader
from runtime.data.movielens.reader import (
    DEFAULT_THRESHOLD,
    MovieLensReader,
    movielens_layout,
    movies_file,
    rating_ids,
    ratings_file,
)
from runtime.data.movielens.vocab import MOVIES_FILES, Vocabulary, build_vocabulary, load_or_build, with_genres
from runtime.data.reader_names import READERS, data_forms
from runtime.data.tables.csv_files import CsvReader


@dataclass(frozen=True, slots=True)
class DataChoice:
    """A reader and the path it reads (None for synthetic)."""

    reader: str
    path: str | None

    def __str__(self) -> str:
        return self.reader if self.path is None else f"{self.reader}:{self.path}"


def choose_data(text: str | None, inputs: ModelInputs) -> DataChoice:
    """The data `--data TEXT` selects, falling back on the spec's `data:` section."""
    section = inputs.data
    if text is None:
        if section is None:
            return DataChoice("synthetic", None)
        return DataChoice(section.reader, section.path)
    reader, path = _split(text)
    if reader is not None:
        if reader == "synthetic" and path:
            raise DataError(f"--data {text}: the synthetic reader reads no files")
        if reader != "synthetic" and not path:
            raise DataError(f"--data {text}: give the path after '{reader}:'")
        return DataChoice(reader, path or None)
    named, colon, _ = text.partition(":")
    if colon and named.isidentifier() and not Path(text).exists():
        close = difflib.get_close_matches(named, READERS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DataError(f"--data {text}: unknown reader {named!r}{hint}; the readers: {data_forms()}")
    if section is None or section.reader == "synthetic":
        raise DataError(f"--data {text}: name the reader ({data_forms(READERS[1:])}); the spec's data section does not")
    return DataChoice(section.reader, text)


def read_paths(text: str) -> tuple[Path, ...]:
    """The files and directories `--data TEXT` may read (none for synthetic): its path, and beside
    a MovieLens ratings file the movies files genres are read from. For refusing an output that
    would overwrite the input; the reader of a bare PATH (the spec's) does not matter here."""
    reader, path = _split(text)
    if not path or reader == "synthetic":
        return ()
    paths = (Path(path),)
    if reader == "movielens" and paths[0].is_file():
        paths += tuple(paths[0].with_name(name) for name in MOVIES_FILES.values())
    return paths


def _split(text: str) -> tuple[str | None, str]:
    """(reader, path) of `READER:PATH` or `synthetic`; (None, TEXT) for a bare path."""
    reader, colon, path = text.partition(":")
    if reader in READERS and (colon or reader == "synthetic"):
        return reader, path
    return None, text


def open_reader(
    inputs: ModelInputs,
    choice: DataChoice,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    vocab_path: Path | None = None,
    save_vocab: bool = False,
    vocabulary: Vocabulary | None = None,
    training: Reader | None = None,
    held_out: bool = False,
    requests: bool = False,
) -> Reader:
    """The reader of `choice` for `inputs`; MovieLens uses `vocabulary`, else the one saved at
    `vocab_path` while current, else one built now (and saved there when `save_vocab`).
    `requests`: rows to score (predict, retrieve): a csv or parquet file's label columns may be
    absent and are never read.

    `training`: the training data's reader when `choice` is evaluation data or requests; a
    MovieLens file then takes its rows' histories from the training file too. `held_out`: the
    rows are evaluated against their own movie (runtime.data.movielens.reader.MovieLensReader)."""
    if choice.path is None:
        raise DataError(f"the {choice.reader} reader reads no files")
    if choice.reader == "prepared":
        raise DataError(f"{choice}: prepared data is read by rank (runtime.data.prepared), not line by line")
    reader = _open(
        read_inputs(inputs), choice, threshold, vocab_path, save_vocab, vocabulary, training, held_out, requests
    )
    if next(iter(reader.epoch_lines()), None) is None:
        raise DataError(f"{choice.path}: no data lines")
    return FeatureReader(reader, inputs) if derives(inputs) else reader


def _open(
    inputs: ModelInputs,
    choice: DataChoice,
    threshold: float,
    vocab_path: Path | None,
    save_vocab: bool,
    vocabulary: Vocabulary | None,
    training: Reader | None,
    held_out: bool = False,
    requests: bool = False,
) -> Reader:
    """The reader of `choice` parsing the columns of `inputs`."""
    assert choice.path is not None
    reader: Reader
    if choice.reader == "criteo":
        reader = CriteoReader(inputs, choice.path)
    elif choice.reader == "csv":
        reader = CsvReader(inputs, choice.path, requests)
    elif choice.reader == "parquet":
        from runtime.data.tables.parquet_files import ParquetReader  # pyarrow, an optional extra

        reader = ParquetReader(inputs, choice.path, requests)
    elif choice.reader == "movielens":
        training = training.inner if isinstance(training, FeatureReader) else training
        earlier = training.file if isinstance(training, MovieLensReader) else None
        reader = _movielens(inputs, choice.path, threshold, vocab_path, save_vocab, vocabulary, earlier, held_out)
    else:
        raise DataError(f"unknown reader {choice.reader!r} (expected one of {', '.join(READERS)})")
    return reader


def _movielens(
    inputs: ModelInputs,
    path: str,
    threshold: float,
    vocab_path: Path | None,
    save_vocab: bool,
    vocabulary: Vocabulary | None,
    earlier: Path | None,
    held_out: bool,
) -> MovieLensReader:
    layout = movielens_layout(inputs)
    file, file_layout = ratings_file(path)
    genres = layout.genres is not None

    def build() -> Vocabulary:
        built = build_vocabulary(rating_ids(file, file_layout))
        return with_genres(built, movies_file(file, file_layout), file_layout) if genres else built

    if vocabulary is None:
        vocabulary = load_or_build(file, vocab_path, build, save_vocab, genres)
    elif genres and not vocabulary.genres:  # saved before genres were kept with the ids
        vocabulary = with_genres(vocabulary, movies_file(file, file_layout), file_layout)
    return MovieLensReader(inputs, path, vocabulary, threshold, earlier, held_out)
