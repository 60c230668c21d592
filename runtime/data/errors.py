"""The errors of the data readers.

`DataError` is anything that stops reading: a missing file, a spec whose
features the file cannot feed, a bad row under `--bad-rows fail`. Its message
names the file, and where one is to blame the line, the column and the value.
`RowError` is what a reader's `parse` raises for one malformed line; the
loader adds the file and line number and turns it into a `BadRow`.
"""

from __future__ import annotations


class DataError(Exception):
    """Reading training data failed; the message says where and why."""


class RowError(ValueError):
    """One line cannot be parsed: which column (None: the line as a whole), what value, why."""

    def __init__(self, column: str | None, value: bytes | str, reason: str) -> None:
        self.column = column
        self.value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        self.reason = reason
        super().__init__(reason if column is None else f"column {column}: {reason}")
