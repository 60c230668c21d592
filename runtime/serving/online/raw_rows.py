"""A request's raw columns as model inputs, through the very functions the readers parse files with.

    rows = raw_rows(module.INPUTS, vocabulary)          # the spec's reader decides the columns
    rows.inputs      -> (RawInput("userId", "INT64", ...), RawInput("movieId", "INT64", ...))
    parsed = rows.parse({"userId": [1, 2], "movieId": [1000, 1007]}, 2)   # RowError names column, row
    batch = rows.batch(parsed)                          # a runtime.data.batch.Batch, as `predict` makes

The inputs are the raw data columns the model reads, named as the reader
names them: a csv/parquet spec's `data.columns` (its label columns left
out), Criteo's I1..I13 and C1..C26, MovieLens's userId and movieId (genres
come from the movie's id through the export's vocabulary, as the reader
takes them). A row goes through the reader's own parsing:
`runtime.data.tables.mapping.parse_row` for tables, the reader's `parse` of
the line those values make for Criteo and MovieLens; then the reader's
`to_columns` and `runtime.data.feature_columns.to_features`. So a served row
gets the ids and floats `reccompile predict` gives the same row in a file,
and whatever those functions learn to apply (issue "own data") applies here
unchanged. Labels are not inputs: each row gets a neutral one (0; a rating
of 5) that the model never reads.

A MovieLens `history` feature is refused: its values come from the ratings
file the reader indexes, which a server does not have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.config.data import ModelInputs
from runtime.data.batch import Batch
from runtime.data.columns import Columns
from runtime.data.criteo.reader import CAT_COLUMNS, INT_COLUMNS, CriteoReader, criteo_layout
from runtime.data.errors import DataError, RowError
from runtime.data.feature_columns import derives, read_inputs, to_features
from runtime.data.movielens.reader import DEFAULT_THRESHOLD, MovieLensReader, check_rows, movielens_layout
from runtime.data.movielens.vocab import Vocabulary
from runtime.data.spec_columns import is_weighted
from runtime.data.tables.mapping import parse_row, table_layout, to_columns

__all__ = ["RawInput", "RawRows", "raw_rows"]

NUMBERS = ("FP32", "FP64", "INT64", "INT32")
IDS = ("BYTES", "INT64", "INT32")


@dataclass(frozen=True, slots=True)
class RawInput:
    """One raw column: its name, the datatype metadata declares, and the datatypes a request may send."""

    name: str
    datatype: str
    accepts: tuple[str, ...]


class RawRows(Protocol):
    inputs: tuple[RawInput, ...]
    feature_columns: dict[str, str]  # sparse feature -> the raw column its ids come from

    def parse(self, fields: Mapping[str, Sequence[Any]], rows: int) -> list[Any]:
        """Each row's values parsed by the reader; RowError (its column, `row` set) at the first bad one."""

    def batch(self, parsed: Sequence[Any]) -> Batch:
        """The parsed rows of one or more requests as one batch."""


class BadValue(RowError):
    """A RowError that says which row of the request it is in."""

    def __init__(self, error: RowError, row: int) -> None:
        super().__init__(error.column, error.value, error.reason)
        self.row = row


def raw_rows(
    inputs: ModelInputs, vocabulary: Vocabulary | None, unused: Sequence[str] = (), reader: str | None = None
) -> RawRows:
    """The raw columns of `inputs`' reader: the spec's data section's, else MovieLens's when the export
    has a vocabulary (only MovieLens training saves one), else `reader`. The columns that feed only
    the features `unused` are no inputs (a retrieval model's item feature, which the query tower
    does not read), filled with an empty value. DataError when the model cannot be served from raw columns."""
    if inputs.data is not None and inputs.data.reader != "synthetic":
        reader = inputs.data.reader
    elif vocabulary is not None:
        reader = "movielens"
    own = read_inputs(inputs)
    if reader in ("csv", "parquet"):
        return _TableRows(inputs, own, reader, set(unused))
    if reader == "criteo":
        return _CriteoRows(inputs, own, set(unused))
    if reader == "movielens":
        if vocabulary is None:
            raise DataError(
                "a MovieLens model is served with the vocabulary it was trained with: the export has no vocab.json"
            )
        return _MovieLensRows(inputs, own, vocabulary, set(unused))
    raise DataError(
        "the spec has no data section naming a file reader: say whose columns requests carry with "
        "--reader criteo|csv|parquet|movielens"
        if reader is None
        else f"--reader {reader}: not a reader of raw columns (criteo, csv, parquet, movielens)"
    )


def _parse_all(parse: Any, fields: Mapping[str, Sequence[Any]], rows: int) -> list[Any]:
    names = list(fields)
    try:  # one try for all the rows: the row is found again only when one is bad
        return (
            [parse(dict(zip(names, values, strict=True))) for values in zip(*fields.values(), strict=True)]
            if names
            else [parse({}) for _ in range(rows)]
        )
    except RowError:
        pass
    for row in range(rows):
        try:
            parse({name: values[row] for name, values in fields.items()})
        except RowError as error:
            raise BadValue(error, row) from None
    raise AssertionError("a row failed once but not again")  # parsing is a pure function of the row


def _text(value: Any) -> str:
    """A value as it stands in a line of text; None (null: an empty field) as nothing."""
    return "" if value is None else str(value)


class _Rows:
    """What every reader shares: `to_columns` of the reader, then the features (fan-out, buckets)."""

    inputs: tuple[RawInput, ...]
    model_inputs: ModelInputs
    weighted: bool

    def to_columns(self, parsed: Sequence[Any]) -> Columns:
        raise NotImplementedError

    def batch(self, parsed: Sequence[Any]) -> Batch:
        columns = self.to_columns(list(parsed))
        if derives(self.model_inputs):
            columns = to_features(columns, self.model_inputs)
        return columns.to_batch(self.weighted)


class _TableRows(_Rows):
    def __init__(self, inputs: ModelInputs, own: ModelInputs, reader: str, unused: set[str]) -> None:
        self.model_inputs, self.weighted = inputs, is_weighted(inputs)
        self.layout = table_layout(own, reader)
        self.feature_columns = {key.key: key.column for key in self.layout.sparse}
        dense = {column for _, columns in self.layout.dense for column in columns}
        used = set(self.layout.feature_columns(unused))
        # Every column the layout reads is an input but those only labels or unused features read.
        idle = {key.column for key in self.layout.sparse if key.key in unused} - used
        self.fill = self.layout.label_fill(unused) | {column: "" for column in idle}
        self.inputs = tuple(
            RawInput(column, "FP32", NUMBERS) if column in dense else RawInput(column, "BYTES", IDS)
            for column in self.layout.columns
            if column not in self.fill
        )

    def parse(self, fields: Mapping[str, Sequence[Any]], rows: int) -> list[Any]:
        return _parse_all(lambda row: parse_row(self.layout, row | self.fill), fields, rows)

    def to_columns(self, parsed: Sequence[Any]) -> Columns:
        return to_columns(self.layout, parsed)


class _CriteoLines(CriteoReader):
    """The Criteo reader's parsing and columns, without its files."""

    def __init__(self, own: ModelInputs) -> None:  # not super().__init__: it opens the files
        self.layout = criteo_layout(own)


class _CriteoRows(_Rows):
    def __init__(self, inputs: ModelInputs, own: ModelInputs, unused: set[str]) -> None:
        self.model_inputs, self.weighted = inputs, is_weighted(inputs)
        self.reader = _CriteoLines(own)
        self.feature_columns = {name: CAT_COLUMNS[c] for name, c, _ in self.reader.layout.sparse}
        used_ints = {INT_COLUMNS[i] for _, columns in self.reader.layout.dense for i in columns}
        used_cats = {CAT_COLUMNS[c] for name, c, _ in self.reader.layout.sparse if name not in unused}
        self.inputs = tuple(RawInput(c, "INT64", ("INT64", "INT32")) for c in INT_COLUMNS if c in used_ints) + tuple(
            RawInput(c, "BYTES", ("BYTES",)) for c in CAT_COLUMNS if c in used_cats
        )

    def _line(self, row: Mapping[str, Any]) -> bytes:
        for name, value in row.items():
            if isinstance(value, str) and ("\t" in value or "\n" in value):
                raise RowError(name, value, "a tab or a newline inside a value")
        fields = ["0", *(_text(row.get(c)) for c in INT_COLUMNS), *(row.get(c, "") for c in CAT_COLUMNS)]
        return "\t".join(fields).encode()

    def parse(self, fields: Mapping[str, Sequence[Any]], rows: int) -> list[Any]:
        return _parse_all(lambda row: self.reader.parse(self._line(row)), fields, rows)

    def to_columns(self, parsed: Sequence[Any]) -> Columns:
        return self.reader.to_columns(list(parsed))


class _MovieLensLines(MovieLensReader):
    """The MovieLens reader's parsing and columns with the export's vocabulary, without a ratings file."""

    def __init__(self, own: ModelInputs, vocabulary: Vocabulary) -> None:  # not super().__init__: it reads the file
        self.layout = movielens_layout(own)
        if self.layout.history is not None:
            raise DataError(
                f"feature {self.layout.history!r}: a MovieLens history comes from the ratings file, "
                "which a server does not read; serve a model without one"
            )
        check_rows(own, self.layout, vocabulary)
        self.vocabulary, self.threshold, self.histories = vocabulary, DEFAULT_THRESHOLD, None
        self._separator = b"::"  # the lines _MovieLensRows makes are ml-1m's


class _MovieLensRows(_Rows):
    def __init__(self, inputs: ModelInputs, own: ModelInputs, vocabulary: Vocabulary, unused: set[str]) -> None:
        self.model_inputs, self.weighted = inputs, is_weighted(inputs)
        self.reader = _MovieLensLines(own, vocabulary)
        layout = self.reader.layout
        self.feature_columns = {
            name: column for column, name in (("userId", layout.user), ("movieId", layout.movie)) if name is not None
        }
        movie = (layout.movie is not None and layout.movie not in unused) or (
            layout.genres is not None and layout.genres not in unused
        )
        self.inputs = tuple(
            RawInput(column, "INT64", ("INT64", "INT32"))
            for column, used in (("userId", layout.user is not None and layout.user not in unused), ("movieId", movie))
            if used
        )

    def _line(self, row: Mapping[str, Any]) -> bytes:
        return f"{_text(row.get('userId', 0))}::{_text(row.get('movieId', 0))}::5::0".encode()

    def parse(self, fields: Mapping[str, Sequence[Any]], rows: int) -> list[Any]:
        return _parse_all(lambda row: self.reader.parse(self._line(row)), fields, rows)

    def to_columns(self, parsed: Sequence[Any]) -> Columns:
        return self.reader.to_columns(list(parsed))
