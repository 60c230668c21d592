"""Honest about hashing: how many distinct values of each hashed feature share a table row.

A csv or parquet feature without a learned transform hashes its values into
its table (runtime.features.hashing), and so does a `cross`: two values that
land on one row are one id to the model, silently. `count_collisions` reads
raw fields (the first `rows` rows of the data) and counts, per hashed
feature, the distinct values seen, the rows they reach and how many of them
share a row with another value:

    feature cat_3: 48,213 distinct values in 100,000 rows; 2,268 (4.7%) share a row of its 1,000,000
    warning: feature cat_3: 4.7% of its distinct values share a row (above 1%): give it a `vocabulary`
             (learned ids, runtime.features.vocabulary) or more num_embeddings

`check --data` counts them in its sample, `data prepare` in the first
`PREPARE_ROWS` rows of the data. Above `WARN_SHARE` of the distinct values
sharing a row, it warns naming the fix. Random hashing of n values into m rows
shares about 1 - exp(-n/m) of them, so 1% is passed from n ≈ m / 100.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from runtime.config.transforms import Cross
from runtime.data.errors import RowError
from runtime.data.tables.mapping import SEPARATOR, TableLayout, items_of, layout_of
from runtime.features.hashing import CROSS_SEPARATOR, cross_text, hash_id

WARN_SHARE = 0.01
PREPARE_ROWS = 100_000


@dataclass(frozen=True, slots=True)
class Collisions:
    """One hashed feature's distinct values in the rows read, and how many share a row."""

    feature: str
    table_rows: int
    rows_read: int
    distinct: int
    shared: int  # distinct values whose row holds another value too

    @property
    def share(self) -> float:
        return self.shared / self.distinct if self.distinct else 0.0

    def describe(self) -> str:
        return (
            f"feature {self.feature}: {self.distinct:,} distinct values in {self.rows_read:,} rows; "
            f"{self.shared:,} ({self.share:.1%}) share a row of its {self.table_rows:,}"
        )

    def warning(self) -> str | None:
        """The warning when too many values share a row, naming the fix; None below WARN_SHARE."""
        if self.share <= WARN_SHARE:
            return None
        return (
            f"feature {self.feature}: {self.share:.1%} of its distinct values share a row (above "
            f"{WARN_SHARE:.0%}): give it a `vocabulary` (learned ids) or more num_embeddings"
        )


def hashed_keys(layout: TableLayout) -> list[Any]:
    """The keys of `layout` whose values are hashed into their table: no learned transform, or a cross."""
    return [
        key
        for key in layout.sparse
        if key.rows is not None and (key.transform is None or isinstance(key.transform, Cross))
    ]


class CollisionCounter:
    """The distinct values of `layout`'s hashed features in the rows `add`ed (their raw fields), up to `rows`
    rows; `result()` says how many share a row. The learning pass feeds one as it reads (no pass of its own)."""

    def __init__(self, layout: TableLayout, rows: int | None = None) -> None:
        self.keys = hashed_keys(layout)
        self.limit = rows
        self.seen: list[set[str]] = [set() for _ in self.keys]
        self.read = 0

    @property
    def full(self) -> bool:
        return not self.keys or (self.limit is not None and self.read >= self.limit)

    def add(self, fields: dict[str, Any]) -> None:
        if self.full:
            return
        self.read += 1
        for values, key in zip(self.seen, self.keys):
            if isinstance(key.transform, Cross):
                values.add(cross_text([fields.get(column) for column in key.transform.columns]))
            else:
                values.update(str(item) for item in items_of(fields.get(key.column)))

    def add_table(self, table: Any) -> None:
        """`add` of every row of `table` (a pyarrow Table of the keys' columns as text, rows all good), a
        column at a time."""
        if self.full:
            return
        if self.limit is not None:
            table = table.slice(0, self.limit - self.read)
        self.read += table.num_rows
        for values, key in zip(self.seen, self.keys, strict=True):
            if isinstance(key.transform, Cross):
                columns = [table.column(column).to_pylist() for column in key.transform.columns]
                values.update(map(CROSS_SEPARATOR.join, zip(*columns, strict=True)))
            else:
                column = table.column(key.column)
                present = pc.filter(column, pc.not_equal(column, ""))
                values.update(pc.unique(pc.list_flatten(pc.split_pattern(present, SEPARATOR))).to_pylist())

    def result(self) -> list[Collisions]:
        found = []
        for values, key in zip(self.seen, self.keys):
            by_row = Counter(hash_id(value, key.rows) for value in values)
            shared = sum(count for count in by_row.values() if count > 1)
            found.append(Collisions(key.key, key.rows, self.read, len(values), shared))
        return found


def count_collisions(reader: Any, rows: int | None = None) -> list[Collisions]:
    """Per hashed feature of `reader` (a csv or parquet reader), its collisions in the first `rows` rows
    (all without a limit); bad rows are left out."""
    layout = layout_of(reader)
    if layout is None:
        return []
    counter = CollisionCounter(layout, rows)
    lines = reader.epoch_lines()
    while not counter.full:
        line = next(lines, None)
        if line is None:
            break
        try:
            counter.add(reader.fields(line[2]))
        except RowError:
            continue
    return counter.result()
