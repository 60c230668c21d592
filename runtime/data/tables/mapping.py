"""What each column of a generic table feeds, and one row's fields as the features' values.

The spec's `data.columns` names, for every column it uses, a dense feature,
a sparse feature (or timestamps feature) or a head label; the kind follows
from the target:

    dense feature of size s     s columns, in the order data.columns lists them: finite numbers (empty: 0)
    sparse feature              one column: an id, or a bag / sequence of them, `|`-separated in
                                text (a list in Parquet). An integer id (ASCII digits, an optional
                                leading '-') is taken mod the table's
                                rows; any other value is hashed (blake2b, 64 bits) mod the rows,
                                the same on every machine. An empty single-id field is id 0.
                                A sequence keeps its `max_length` ids on its `keep` side; a bag
                                longer than its `max_ids_per_sample` is a bad row.
    timestamps feature          one column of integers, `|`-separated (a list), cut as its sequence
    head label                  one column: a finite number; a bce head's in [0, 1], a softmax head's
                                a class number (0, 1, ...)

Every feature and head label must be fed; columns not listed are ignored.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from runtime.data.columns import Columns, Jagged
from runtime.data.errors import DataError, RowError
from runtime.data.features import ModelInputs
from runtime.data.spec_columns import feature_list, heads_by_label

SEPARATOR = "|"


_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits: str.isdigit() takes '²', which int() refuses
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # what a time tensor holds


@dataclass(frozen=True, slots=True)
class SparseColumn:
    """A sparse (or timestamps) key fed by one column."""

    key: str
    column: str
    rows: int | None  # table rows (ids are taken mod them); None: timestamps, kept as they are
    single: bool  # exactly one id per row
    max_length: int | None
    keep: str
    sequence: int | None = None  # timestamps: the index in the layout's keys of the sequence they time
    max_ids: int | None = None  # a variable-length bag's max_ids_per_sample


@dataclass(frozen=True, slots=True)
class TableLayout:
    """Which columns feed which dense features, sparse keys (batch order) and labels."""

    dense: tuple[tuple[str, tuple[str, ...]], ...]
    sparse: tuple[SparseColumn, ...]
    labels: tuple[tuple[str, str], ...]  # (head label, column)
    label_kinds: tuple[tuple[str, int], ...]  # per label: its head's loss and classes, for the row checks

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the layout reads, each once."""
        names = [c for _, cols in self.dense for c in cols] + [s.column for s in self.sparse]
        names += [column for _, column in self.labels]
        return tuple(dict.fromkeys(names))


def table_layout(inputs: ModelInputs, reader: str) -> TableLayout:
    """The layout `inputs`' data.columns gives a `reader` (csv or parquet) table; DataError naming what is unfed."""
    if inputs.data is None or inputs.data.reader != reader or not inputs.data.columns:
        raise DataError(f"the {reader} reader needs the spec's data section with reader: {reader} and its columns")
    dense = {f.name: f for f in inputs.dense}
    sparse = {f.name: f for f in inputs.sparse}
    stamps = {t.name: t for t in inputs.timestamps}
    labels = heads_by_label(inputs)
    fed_dense: dict[str, list[str]] = {name: [] for name in dense}
    fed_sparse: dict[str, str] = {}
    fed_labels: dict[str, str] = {}
    for column, target in inputs.data.columns:
        if target in dense:
            fed_dense[target].append(column)
        elif target in sparse or target in stamps:
            if target in fed_sparse:
                raise DataError(f"data.columns: {target!r} is fed by both {fed_sparse[target]} and {column}")
            fed_sparse[target] = column
        elif target in labels:
            if target in fed_labels:
                raise DataError(f"data.columns: label {target!r} is fed by both {fed_labels[target]} and {column}")
            fed_labels[target] = column
        else:
            raise DataError(f"data.columns.{column}: {target!r} is no feature or head label of the spec")
    for name, columns in fed_dense.items():
        if len(columns) != dense[name].size:
            raise DataError(
                f"dense feature {name!r} has size {dense[name].size} but {len(columns)} columns feed it"
                + (f" ({', '.join(columns)})" if columns else "")
            )
    unfed = [n for n in [*sparse, *stamps] if n not in fed_sparse] + [n for n in labels if n not in fed_labels]
    if unfed:
        raise DataError(f"{feature_list(unfed)} {'is' if len(unfed) == 1 else 'are'} fed by no column of data.columns")
    keys = []
    order = list(sparse)
    for name in [*sparse, *stamps]:
        if name in sparse:
            f = sparse[name]
            single = f.fixed_ids and f.ids_per_sample == 1 and f.max_length is None
            max_ids = None if f.fixed_ids or f.max_length is not None else f.ids_per_sample
            keys.append(SparseColumn(name, fed_sparse[name], f.num_embeddings, single, f.max_length, f.keep,
                                     max_ids=max_ids))  # fmt: skip
        else:
            seq = sparse[stamps[name].sequence]
            timed = order.index(stamps[name].sequence)
            keys.append(SparseColumn(name, fed_sparse[name], None, False, seq.max_length, seq.keep, timed))
    return TableLayout(
        tuple((name, tuple(cols)) for name, cols in fed_dense.items()), tuple(keys),
        tuple((label, fed_labels[label]) for label in labels),
        tuple((head.loss, head.num_classes) for head in labels.values()),
    )  # fmt: skip


# One parsed row: dense values by feature, ids by sparse key, labels.
TableRow = tuple[list[list[float]], list[list[int]], list[float]]


def parse_row(layout: TableLayout, fields: dict[str, Any]) -> TableRow:
    """A row's fields (column -> text, or a list / number from Parquet) as values; RowError names the column."""
    dense = [[_number(column, fields[column], 0.0) for column in columns] for _, columns in layout.dense]
    ids = [_ids(key, fields[key.column]) for key in layout.sparse]
    for key in layout.sparse:
        if key.sequence is not None:  # timestamps: one per id of their sequence, before either is cut
            timed = layout.sparse[key.sequence]
            times, items = len(_items(fields[key.column])), len(_items(fields[timed.column]))
            if times != items:
                reason = f"{times} times but its sequence {timed.key!r} (column {timed.column}) has {items} ids"
                raise RowError(key.column, str(fields[key.column]), reason)
    kinds = zip(layout.labels, layout.label_kinds, strict=True)
    labels = [_label(column, fields[column], *kind) for (_, column), kind in kinds]
    return dense, ids, labels


def to_columns(layout: TableLayout, rows: Sequence[TableRow]) -> Columns:
    dense = {
        name: torch.tensor([row[0][i] for row in rows], dtype=torch.float32).reshape(len(rows), len(columns))
        for i, (name, columns) in enumerate(layout.dense)
    }
    sparse = {}
    for i, key in enumerate(layout.sparse):
        bags = [row[1][i] for row in rows]
        lengths = torch.tensor([len(bag) for bag in bags], dtype=torch.long)
        sparse[key.key] = Jagged(lengths, torch.tensor([v for bag in bags for v in bag], dtype=torch.long), None)
    labels = {label: torch.tensor([row[2][i] for row in rows], dtype=torch.float32)
              for i, (label, _) in enumerate(layout.labels)}  # fmt: skip
    return Columns(dense, sparse, labels)


def _number(column: str, value: Any, empty: float | None) -> float:
    if value is None or value == "":
        if empty is None:
            raise RowError(column, "", "a label must not be empty")
        return empty
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RowError(column, str(value), "not a number") from None
    if not math.isfinite(number):
        raise RowError(column, str(value), "not a finite number")
    return number


def _label(column: str, value: Any, loss: str, classes: int) -> float:
    """A label as its head's loss reads it: bce in [0, 1], softmax a class number, mse any finite number."""
    label = _number(column, value, None)
    if loss == "bce" and not 0.0 <= label <= 1.0:
        raise RowError(column, str(value), "a bce label must be in [0, 1]")
    if loss == "softmax" and not (label.is_integer() and 0 <= label < classes):
        raise RowError(column, str(value), f"a softmax label must be a class number 0..{classes - 1}")
    return label


def _items(value: Any) -> list[Any]:
    """A field's values: a list (Parquet), `|`-separated text, one value, or none when empty."""
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return value.split(SEPARATOR)
    return [value]


def _ids(key: SparseColumn, value: Any) -> list[int]:
    items = _items(value)
    if key.single:
        if len(items) > 1:
            raise RowError(key.column, str(value), f"{len(items)} ids, but feature {key.key!r} takes one")
        items = items or [0]
    if key.max_ids is not None and len(items) > key.max_ids:
        reason = f"{len(items)} ids, but feature {key.key!r} takes at most {key.max_ids} (max_ids_per_sample)"
        raise RowError(key.column, str(value), reason)
    if key.max_length is not None and len(items) > key.max_length:
        items = items[-key.max_length :] if key.keep == "end" else items[: key.max_length]
    return [_id(key, item) for item in items]


def _id(key: SparseColumn, item: Any) -> int:
    if key.rows is None:  # a time
        try:
            time = int(item)
        except (TypeError, ValueError):
            raise RowError(key.column, str(item), "not an integer time") from None
        if not _INT64_MIN <= time <= _INT64_MAX:
            raise RowError(key.column, str(item), "a time outside the 64-bit integers")
        return time
    if isinstance(item, int) or (isinstance(item, str) and _INTEGER.fullmatch(item)):
        return int(item) % key.rows
    digest = hashlib.blake2b(str(item).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % key.rows
