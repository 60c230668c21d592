"""`parquet:PATH`: Parquet files, their columns mapped by `data.columns` (runtime.data.tables.mapping).

PATH is a file or a directory of them (natural order). Only the mapped
columns are read. A bag or sequence is a list column (or a `|`-separated
string column); ids may be integers or strings (hashed). Rows are numbered
from 1 within each file, so a bad row is named FILE:ROW as a text file's
line would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from runtime.config.data import ModelInputs, TimestampsConfig
from runtime.config.transforms import Vocabulary
from runtime.data.columns import Columns
from runtime.data.errors import DataError
from runtime.data.files.arrow import pa, pq
from runtime.data.files.text_lines import data_files
from runtime.data.spec_columns import is_weighted
from runtime.data.tables.mapping import TableLayout, TableRow, parse_row, table_layout, to_columns

_READ_ROWS = 4096


class ParquetReader:
    """Parquet files for one spec; a "line" here is one row, as a column -> value dict."""

    name = "parquet"

    def __init__(self, inputs: ModelInputs, path: str | Path, requests: bool = False) -> None:
        """`requests`: rows to score, whose label columns may be absent and are never read."""
        self.layout: TableLayout = table_layout(inputs, "parquet")
        self.fill = self.layout.label_fill() if requests else {}
        self.read = [c for c in self.layout.columns if c not in self.fill]
        self.files = data_files(path)
        self.source = str(path)
        self.weighted = is_weighted(inputs)
        self.timestamps: tuple[TimestampsConfig, ...] = inputs.timestamps
        for file in self.files:
            try:
                names = pq.ParquetFile(file).schema_arrow.names
            except (OSError, pa.ArrowException) as error:
                raise DataError(f"{file}: not a readable Parquet file ({error})") from None
            missing = [c for c in self.read if c not in names]
            if missing:
                raise DataError(f"{file}: no column {missing[0]!r} (data.columns maps it)")

    def epoch_lines(self) -> Iterator[tuple[str, int, Any]]:
        """(file, row number from 1, the row's mapped columns) of every row of every file."""
        for file in self.files:
            number = 0
            for batch in pq.ParquetFile(file).iter_batches(batch_size=_READ_ROWS, columns=self.read):
                for row in batch.to_pylist():
                    number += 1
                    yield str(file), number, row | self.fill

    @property
    def unseen_features(self) -> tuple[str, ...]:
        """The features with a learned vocabulary, whose OOV ids are counted (runtime.data.checks.unseen_ids)."""
        return tuple(key.key for key in self.layout.sparse if isinstance(key.transform, Vocabulary))

    @property
    def oov_rows(self) -> dict[str, int]:
        """Per vocabulary feature, its OOV rows (the first rows of its table)."""
        keys = self.layout.sparse
        return {key.key: key.transform.oov_buckets for key in keys if isinstance(key.transform, Vocabulary)}

    def fields(self, line: Any) -> dict[str, Any]:
        """The row's mapped columns (a row is read as that dict already)."""
        return line

    def parse(self, line: Any) -> TableRow:
        return parse_row(self.layout, line)

    def to_columns(self, rows: list[TableRow]) -> Columns:
        return to_columns(self.layout, rows)
