"""Bad rows: counted, reported with their file and line, never dropped silently.

Under `--bad-rows fail` (the default) the first bad row stops the run with
its file, line, column, value and reason. Under `--bad-rows skip` every bad
row is counted, the first few are reported as they are met, and `summary()`
gives the count and the first examples at the end.

Every rank parses every row (see `runtime.data.rank_slices`), so every rank meets
the same bad rows at the same step: counts need no reduction across ranks
and a failure stops all ranks together.

A bad row is counted once however often the data is read: training reads
its data again from the beginning when it runs out, and evaluation reads
its data at every pass, but once the reader says a pass ended (`end_pass`)
the counts are those of the data, and later passes add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from runtime.data.errors import DataError, RowError

BadRowPolicy = Literal["fail", "skip"]
BAD_ROW_POLICIES: tuple[BadRowPolicy, ...] = ("fail", "skip")
EXAMPLES = 5  # bad rows shown as they are met and in the summary
_VALUE_CHARS = 40


@dataclass(frozen=True, slots=True)
class BadRow:
    """One malformed line: where it is, which column and value, and why."""

    file: str
    line: int
    column: str | None  # None: the line as a whole (e.g. its field count)
    value: str
    reason: str

    @staticmethod
    def from_error(file: str, line: int, error: RowError) -> BadRow:
        value = error.value if len(error.value) <= _VALUE_CHARS else error.value[:_VALUE_CHARS] + "..."
        return BadRow(file, line, error.column, value, error.reason)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " + ("" if self.column is None else f"column {self.column}: ")
        return f"{where}{self.reason} (value {self.value!r})"


class BadRowError(DataError):
    """A bad row under the `fail` policy."""

    def __init__(self, row: BadRow) -> None:
        self.row = row
        super().__init__(f"{row}; pass --bad-rows skip to count and skip bad rows instead")


class BadRowLog:
    """Counts rows and bad rows of one data source; applies the bad-row policy."""

    def __init__(self, policy: BadRowPolicy = "fail", warn: Callable[[str], None] | None = None) -> None:
        if policy not in BAD_ROW_POLICIES:
            raise ValueError(f"bad-row policy must be one of {BAD_ROW_POLICIES}, got {policy!r}")
        self.policy = policy
        self.rows = 0  # lines read, good and bad, of the first pass
        self.bad = 0
        self.examples: list[BadRow] = []
        self.whole = False  # a whole pass was read: later passes meet the same rows again
        self.again = False  # rows of a later pass were read (and not counted)
        self._warn = warn

    def count_rows(self, rows: int) -> None:
        if self.whole:
            self.again = True
        else:
            self.rows += rows

    def end_pass(self) -> None:
        """The data was read to its end: its rows and bad rows are all counted."""
        self.whole = True

    def add(self, row: BadRow) -> None:
        """Record one bad row (an example when among the first); raise under `fail`."""
        if self.policy == "fail":
            raise BadRowError(row)
        if self.whole:
            return
        self.bad += 1
        if len(self.examples) < EXAMPLES and row not in self.examples:  # a resumed prepare reads some again
            self.examples.append(row)
            if self._warn is not None:
                self._warn(f"skipped bad row {row}")
                if len(self.examples) == EXAMPLES:
                    self._warn("further bad rows are counted and summarised at the end")

    def add_many(self, rows: list[BadRow], count: int) -> None:
        """Record `count` bad rows of which `rows` are the first (one block's report)."""
        for row in rows:
            self.add(row)
        if self.policy == "skip" and not self.whole:
            self.bad += count - len(rows)

    def summary(self) -> str | None:
        """The end-of-run report of skipped rows, or None when there were none."""
        if self.bad == 0:
            return None
        of = (
            f"the data's {self.rows:,}, counted once though it was read more than once"
            if self.again
            else (f"{self.rows:,} read")
        )
        lines = [f"skipped {self.bad:,} bad row{'s' if self.bad != 1 else ''} of {of}; the first:"]
        lines += [f"  {row}" for row in self.examples]
        return "\n".join(lines)
