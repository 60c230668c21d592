"""`csv:PATH`: CSV files with a header line, their columns mapped by `data.columns` (runtime.data.tables.mapping).

PATH is a file or a directory of them (runtime.data.files.text_lines: plain or
gzip, natural order); each file starts with the same header line, naming
its columns, the mapped ones among them. Fields are comma-separated, or
tab-separated when the header has a tab, with CSV quoting. Lines are UTF-8:
another line is a bad row (its bytes replaced, two different strings could
hash to one id).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterator

from runtime.config.data import ModelInputs, TimestampsConfig
from runtime.config.transforms import Vocabulary
from runtime.data.columns import Columns
from runtime.data.errors import DataError, RowError
from runtime.data.files.text_lines import data_files, first_line, numbered_lines
from runtime.data.spec_columns import is_weighted
from runtime.data.tables.mapping import TableLayout, TableRow, parse_row, table_layout, to_columns


class CsvReader:
    """CSV files for one spec; lines are numbered from 1 (the header is line 1)."""

    name = "csv"

    def __init__(self, inputs: ModelInputs, path: str | Path, requests: bool = False) -> None:
        """`requests`: rows to score, whose label columns may be absent and are never read."""
        self.layout: TableLayout = table_layout(inputs, "csv")
        self.fill = self.layout.label_fill() if requests else {}
        self.files = data_files(path)
        self.source = str(path)
        self.weighted = is_weighted(inputs)
        self.timestamps: tuple[TimestampsConfig, ...] = inputs.timestamps
        header = first_line(self.files[0])
        if header is None:
            raise DataError(f"{self.files[0]}: empty, expected a header line naming the columns")
        self.delimiter = "\t" if b"\t" in header else ","
        try:
            self.header = self._fields(header)
        except RowError as error:
            raise DataError(f"{self.files[0]}:1: the header is {error.reason}") from None
        missing = [c for c in self.layout.columns if c not in self.header and c not in self.fill]
        if missing:
            raise DataError(f"{self.files[0]}:1: the header has no column {missing[0]!r} (data.columns maps it)")
        for file in self.files[1:]:
            try:
                same = self._fields(first_line(file) or b"") == self.header
            except RowError:
                same = False
            if not same:
                raise DataError(f"{file}:1: the header differs from {self.files[0]}'s")

    def _fields(self, line: bytes) -> list[str]:
        """The line's fields; a line that is not UTF-8 is a bad row (replacing its bytes would make
        different strings hash to the same id)."""
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            reason = f"not UTF-8 text (byte 0x{line[error.start]:02x} at position {error.start})"
            raise RowError(None, line, reason) from None
        if '"' not in text and "\r" not in text and "\0" not in text:  # the csv module's split, faster
            return text.split(self.delimiter) if text else []
        return next(csv.reader([text], delimiter=self.delimiter), [])

    def epoch_lines(self) -> Iterator[tuple[str, int, bytes]]:
        for file in self.files:
            name = str(file)
            for number, line in numbered_lines(file, skip=1):
                yield name, number, line

    @property
    def unseen_features(self) -> tuple[str, ...]:
        """The features with a learned vocabulary, whose OOV ids are counted (runtime.data.checks.unseen_ids)."""
        return tuple(key.key for key in self.layout.sparse if isinstance(key.transform, Vocabulary))

    @property
    def oov_rows(self) -> dict[str, int]:
        """Per vocabulary feature, its OOV rows (the first rows of its table)."""
        keys = self.layout.sparse
        return {key.key: key.transform.oov_buckets for key in keys if isinstance(key.transform, Vocabulary)}

    def fields(self, line: bytes) -> dict[str, str]:
        """The line's fields by column (raw text); RowError for a line that is no row of the header."""
        fields = self._fields(line)
        if len(fields) != len(self.header):
            raise RowError(None, line, f"{len(fields)} fields, the header has {len(self.header)}")
        row = dict(zip(self.header, fields))
        if self.fill:
            row.update(self.fill)
        return row

    def parse(self, line: bytes) -> TableRow:
        return parse_row(self.layout, self.fields(line))

    def to_columns(self, rows: list[TableRow]) -> Columns:
        return to_columns(self.layout, rows)
