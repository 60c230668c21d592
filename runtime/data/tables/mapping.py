"""What each column of a generic table feeds, and one row's fields as the features' values.

The spec's `data.columns` names, for every column it uses, a dense feature,
a sparse feature (or timestamps feature) or a head label; the kind follows
from the target:

    dense feature of size s     s columns, in the order data.columns lists them: finite numbers (empty: 0)
    sparse feature              one column: an id, or a bag / sequence of them, `|`-separated in
                                text (a list in Parquet). Without a transform an integer id (ASCII
                                digits, an optional leading '-') is taken mod the table's rows; any
                                other value is hashed (blake2b, 64 bits) mod the rows, the same on
                                every machine (runtime.features.hashing); an empty single-id field
                                is id 0. With a `vocabulary` the values (each item of a bag) map
                                through it (runtime.features.vocabulary).
                                A sequence keeps its `max_length` ids on its `keep` side; a bag
                                longer than its `max_ids_per_sample` is a bad row.
    cross / history feature     no data.columns entry: a cross reads its `columns`, a history its
                                `by` and `time` columns and its `of` feature's column
    dense history               no data.columns entry: its `by`, `time` (and `sharing`) columns; its
                                `of` column is read only while learning, from the training rows
    quantiles feature           the column of its dense feature (`column`), bucketized
    timestamps feature          one column of integers, `|`-separated (a list), cut as its sequence;
                                of a history sequence: no column, the times of the history's rows
                                (each earlier row's `time`, as an integer)
    head label                  one column: a finite number; a bce head's in [0, 1], a softmax head's
                                a class number (0, 1, ...)

Every feature and head label must be fed; columns not listed are ignored.

This module is where raw fields become model inputs, for every caller (the
csv and parquet readers, `predict`, `retrieve`, evaluation, a server):
`parse_row` keeps the raw values the learned transforms need (text for a
vocabulary, NaN for an empty field of a transformed dense feature), and
`to_columns` applies the transforms (runtime.features) with the layout's
learned state, `inputs.learned`. Without that state, a layout that needs
one parses rows (for learning) but refuses to build columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Collection, Sequence

import torch

from runtime.config.data import ModelInputs
from runtime.config.transforms import Aggregate, Cross, History, Numeric, Quantiles, Vocabulary
from runtime.data.columns import Columns, Jagged
from runtime.data.errors import DataError, RowError
from runtime.data.spec_columns import feature_list, heads_by_label
from runtime.features.aggregate import composite_key
from runtime.features.hashing import cross_text, hash_id
from runtime.features.registry import transform

SEPARATOR = "|"
LEARNED_KINDS = (Vocabulary.kind, Quantiles.kind, History.kind, Numeric.kind, Aggregate.kind)  # with a state
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
    transform: Any = None  # runtime.config.transforms's sparse transform, or None: hashed
    columns: tuple[str, ...] = ()  # a cross's columns; a history's (by, time, of's column)
    of: int | None = None  # a history: the index in the layout's keys of its `of` feature
    dense: tuple[int, int] | None = None  # quantiles: (dense feature index, column index) of the raw values
    history_times: bool = False  # timestamps of a history sequence: the times of its rows, read from its state

    @property
    def reads(self) -> tuple[str, ...]:
        """The table columns this key reads."""
        if isinstance(self.transform, (Cross, History)) or self.history_times:
            return self.columns
        return (self.column,)


@dataclass(frozen=True, slots=True)
class TableLayout:
    """Which columns feed which dense features, sparse keys (batch order) and labels."""

    dense: tuple[tuple[str, tuple[str, ...]], ...]
    sparse: tuple[SparseColumn, ...]
    labels: tuple[tuple[str, str], ...]  # (head label, column)
    label_kinds: tuple[tuple[str, int], ...]  # per label: its head's loss and classes, for the row checks
    numeric: tuple[Numeric | Aggregate | None, ...] = ()  # per dense feature: its transform
    learned: Any = None  # runtime.features.state.LearnedFeatures: the state of the learned transforms

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the layout reads, each once."""
        return tuple(dict.fromkeys([*self.feature_columns(), *(column for _, column in self.labels)]))

    def feature_columns(self, unused: Collection[str] = ()) -> list[str]:
        """The columns the features read, but for the sparse features `unused` (no inputs of a server)."""
        names = [c for _, cols in self.dense for c in cols]
        names += [c for s in self.sparse if s.key not in unused for c in s.reads]
        return names + [c for numeric in self.numeric if isinstance(numeric, Aggregate) for c in numeric.reads]

    def label_fill(self, unused: Collection[str] = ()) -> dict[str, str]:
        """The columns no feature (but those `unused`) reads that feed labels, each with a label every
        loss takes: what rows to score (a requests file, a served request) hold in their place,
        whether they have them or not: a prediction reads no label."""
        read = set(self.feature_columns(unused))
        return {column: "0" for _, column in self.labels if column not in read}

    def learned_configs(self) -> dict[str, Any]:
        """Feature name -> config of every transform with a learned state."""
        configs = {name: numeric for (name, _), numeric in zip(self.dense, self.numeric) if numeric is not None}
        configs.update(
            {
                key.key: key.transform
                for key in self.sparse
                if key.transform is not None and key.transform.kind in LEARNED_KINDS
            }
        )
        return configs


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
    unfed_kinds = (Cross.kind, History.kind, Quantiles.kind)  # read their columns by name
    derived = {f.name for f in inputs.sparse if f.transform is not None and f.transform.kind in unfed_kinds}
    derived |= {t.name for t in inputs.timestamps if isinstance(sparse[t.sequence].transform, History)}
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
        if isinstance(dense[name].transform, Aggregate):  # made from earlier rows, read by its `by` and `time`
            if columns:
                raise DataError(
                    f"data.columns.{columns[0]}: dense feature {name!r} is an aggregate of earlier rows, "
                    "which no column feeds"
                )
        elif len(columns) != dense[name].size:
            raise DataError(
                f"dense feature {name!r} has size {dense[name].size} but {len(columns)} columns feed it"
                + (f" ({', '.join(columns)})" if columns else "")
            )
    unfed = [n for n in [*sparse, *stamps] if n not in fed_sparse and n not in derived]
    unfed += [n for n in labels if n not in fed_labels]
    if unfed:
        raise DataError(f"{feature_list(unfed)} {'is' if len(unfed) == 1 else 'are'} fed by no column of data.columns")
    keys = []
    order = list(sparse)
    for name in [*sparse, *stamps]:
        if name in sparse:
            keys.append(_sparse_column(sparse[name], fed_sparse, fed_dense, order))
        else:
            seq = sparse[stamps[name].sequence]
            timed = order.index(stamps[name].sequence)
            if isinstance(seq.transform, History):  # the history's own rows' times (its `by` and `time` columns)
                history = keys[timed]
                keys.append(
                    SparseColumn(
                        name,
                        history.column,
                        None,
                        False,
                        seq.max_length,
                        seq.keep,
                        timed,
                        columns=history.columns,
                        history_times=True,
                    )
                )
                continue
            keys.append(SparseColumn(name, fed_sparse[name], None, False, seq.max_length, seq.keep, timed))
    layout = TableLayout(
        tuple((name, tuple(cols)) for name, cols in fed_dense.items()),
        tuple(keys),
        tuple((label, fed_labels[label]) for label in labels),
        tuple((head.loss, head.num_classes) for head in labels.values()),
        tuple(f.transform for f in dense.values()),
        inputs.learned,
    )
    if inputs.learned is not None:  # the state must be the one learned for these transforms
        missing = [name for name in layout.learned_configs() if name not in inputs.learned.features]
        if missing:
            raise DataError(f"{inputs.learned.source}: feature {missing[0]!r} is not learned there")
    return layout


def _sparse_column(
    f: Any, fed_sparse: dict[str, str], fed_dense: dict[str, list[str]], order: list[str]
) -> SparseColumn:
    """The key of sparse feature `f` (a SparseFeatureConfig): what it reads and how."""
    single = f.fixed_ids and f.ids_per_sample == 1 and f.max_length is None
    max_ids = None if f.fixed_ids or f.max_length is not None else f.ids_per_sample
    spec = f.transform
    column, columns, of, dense = fed_sparse.get(f.name, ""), (), None, None
    if isinstance(spec, Cross):
        column, columns = spec.columns[0], spec.columns
    elif isinstance(spec, History):
        if spec.of not in fed_sparse:
            raise DataError(f"feature {f.name!r}: its history is of {spec.of!r}, which no column feeds")
        column, columns, of = spec.by, (spec.by, spec.time, fed_sparse[spec.of]), order.index(spec.of)
    elif isinstance(spec, Quantiles):
        names = list(fed_dense)
        column, dense = fed_dense[f.column][f.column_index], (names.index(f.column), f.column_index)
    return SparseColumn(
        f.name,
        column,
        f.num_embeddings,
        single,
        f.max_length,
        f.keep,
        max_ids=max_ids,
        transform=spec,
        columns=columns,
        of=of,
        dense=dense,
    )


def layout_of(reader: Any) -> TableLayout | None:
    """The table layout of a csv or parquet reader (wrapped or not), None for the other readers."""
    layout = getattr(reader, "layout", None)
    return layout if isinstance(layout, TableLayout) else None


# One parsed row: dense values by feature, ids by sparse key, labels.
TableRow = tuple[list[list[float]], list[list[int]], list[float]]


def parse_row(layout: TableLayout, fields: dict[str, Any]) -> TableRow:
    """A row's fields (column -> text, or a list / number from Parquet) as values; RowError names the column."""
    empty = [0.0 if numeric is None else math.nan for numeric in layout.numeric]
    made: dict[tuple[str, ...], list[Any]] = {}  # aggregates of the same key, time and sharing columns share one
    dense = [
        made.get(numeric.reads) or made.setdefault(numeric.reads, _aggregated(numeric, fields))
        if isinstance(numeric := _numeric(layout, i), Aggregate)
        else [_number(column, fields[column], empty[i]) for column in columns]
        for i, (_, columns) in enumerate(layout.dense)
    ]
    ids = [
        _ids(key, fields[key.column]) if key.transform is None and not key.history_times else _raw(key, fields)
        for key in layout.sparse
    ]
    for key in layout.sparse:  # timestamps of a column: one per id of their sequence, before either is cut
        if key.sequence is not None and not key.history_times:
            timed = layout.sparse[key.sequence]
            times, items = len(items_of(fields[key.column])), len(items_of(fields[timed.column]))
            if times != items:
                reason = f"{times} times but its sequence {timed.key!r} (column {timed.column}) has {items} ids"
                raise RowError(key.column, str(fields[key.column]), reason)
    kinds = zip(layout.labels, layout.label_kinds, strict=True)
    labels = [_label(column, fields[column], *kind) for (_, column), kind in kinds]
    return dense, ids, labels


def parse_learned(layout: TableLayout, fields: dict[str, Any], names: frozenset[str]) -> TableRow:
    """`parse_row`'s values of the features `names` only (those a learning pass fits), None for the others:
    learning reads no other column (runtime.data.tables.learn)."""
    dense = [
        None
        if name not in names
        else _aggregated(numeric, fields, learning=True)
        if isinstance(numeric := _numeric(layout, i), Aggregate)
        else [_number(column, fields[column], math.nan) for column in columns]
        for i, (name, columns) in enumerate(layout.dense)
    ]
    ids = [_learned_raw(key, fields) if key.key in names else None for key in layout.sparse]
    return dense, ids, []  # type: ignore[return-value]


def _numeric(layout: TableLayout, i: int) -> Numeric | Aggregate | None:
    return layout.numeric[i] if layout.numeric else None


def _moment(column: str, value: Any) -> float:
    """A history's time: a number, empty meaning after every training row."""
    return math.inf if value is None or value == "" else _number(column, value, None)


def _aggregated(config: Aggregate, fields: dict[str, Any], learning: bool = False) -> list[Any]:
    """An aggregate feature's raw value: one (key, time, sharing values) of the row; while learning
    (a training row) also its `of` value, NaN when empty: no other path reads `of`, so an evaluation
    row's or a request's label never enters an aggregate."""
    by = fields[config.by] if isinstance(config.by, str) else composite_key([fields[c] for c in config.by])
    shared = tuple(str(item) for item in items_of(fields[config.sharing])) if config.sharing is not None else ()
    event: tuple[Any, ...] = ("" if by is None else str(by), _moment(config.time, fields[config.time]), shared)
    if learning:
        event += (math.nan if config.of is None else _number(config.of, fields[config.of], math.nan),)
    return [event]


def _learned_raw(key: SparseColumn, fields: dict[str, Any]) -> list[Any]:
    """`_raw`, and for a history with `where` whether the training row enters it (its event's fourth
    value): only learning reads the `where` column, so no evaluation or request row's label is ever read."""
    raw = _raw(key, fields)
    where = key.transform.where if isinstance(key.transform, History) else None
    if where is None:
        return raw
    return [(*raw[0], _number(where[0], fields[where[0]], math.nan) == where[1])]


def to_columns(layout: TableLayout, rows: Sequence[TableRow]) -> Columns:
    """The model inputs of parsed `rows`: every transform applied with the layout's learned state."""
    learned = layout.learned
    if learned is None and layout.learned_configs():
        names = ", ".join(repr(name) for name in layout.learned_configs())
        raise DataError(
            f"features {names} have learned transforms but no learned state: learn them "
            "(reccompile data prepare, or train on the raw files) or read the state saved with them"
        )
    dense = {}
    for i, (name, columns) in enumerate(layout.dense):
        numeric = _numeric(layout, i)
        if isinstance(numeric, Aggregate):
            dense[name] = _apply(learned, name, [row[0][i][0] for row in rows])
            continue
        raw = torch.tensor([row[0][i] for row in rows], dtype=torch.float64).reshape(len(rows), len(columns))
        dense[name] = (raw if numeric is None else _apply(learned, name, raw)).float()
    sparse = {}
    for i, key in enumerate(layout.sparse):
        bags = [row[1][i] for row in rows]
        if key.transform is not None or key.history_times:
            sparse[key.key] = Jagged(*_transformed(layout, key, bags), None)
            continue
        lengths = torch.tensor([len(bag) for bag in bags], dtype=torch.long)
        sparse[key.key] = Jagged(lengths, torch.tensor([v for bag in bags for v in bag], dtype=torch.long), None)
    labels = {
        label: torch.tensor([row[2][i] for row in rows], dtype=torch.float32)
        for i, (label, _) in enumerate(layout.labels)
    }
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


def items_of(value: Any) -> list[Any]:
    """A field's values: a list (Parquet), `|`-separated text, one value, or none when empty."""
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return value.split(SEPARATOR)
    return [value]


def _ids(key: SparseColumn, value: Any) -> list[int]:
    items = items_of(value)
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
    return hash_id(item, key.rows)


def _raw(key: SparseColumn, fields: dict[str, Any]) -> list[Any]:
    """A transformed key's raw values: text items (vocabulary), one cross text, one (key, time, value)
    event (history) or one number, NaN when empty (quantiles)."""
    spec = key.transform
    value = fields[key.column]
    if key.single and type(spec) is Vocabulary and type(value) is str and SEPARATOR not in value:
        return [value]  # the common case, a CSV id, without the general path's lists
    if isinstance(spec, Cross):
        return [cross_text([fields[column] for column in spec.columns])]
    if isinstance(spec, History) or key.history_times:
        by, time, value = (fields[column] for column in key.columns)
        moment = _moment(key.columns[1], time)
        return [("" if by is None else str(by), moment, "" if value is None else str(value))]
    if isinstance(spec, Quantiles):
        return [_number(key.column, fields[key.column], math.nan)]
    items = items_of(fields[key.column])
    if key.single:
        if len(items) > 1:
            raise RowError(key.column, str(fields[key.column]), f"{len(items)} ids, but feature {key.key!r} takes one")
        items = items or [""]
    if key.max_ids is not None and len(items) > key.max_ids:
        reason = f"{len(items)} ids, but feature {key.key!r} takes at most {key.max_ids} (max_ids_per_sample)"
        raise RowError(key.column, str(fields[key.column]), reason)
    if key.max_length is not None and len(items) > key.max_length:
        items = items[-key.max_length :] if key.keep == "end" else items[: key.max_length]
    return items if type(value) is str else [str(item) for item in items]


def _apply(learned: Any, name: str, raw: Any, *extra: Any) -> Any:
    """Feature `name`'s learned transform applied to `raw`."""
    entry = learned.get(name)
    return transform(entry.kind).apply(entry.config, entry.state, raw, *extra)


def _transformed(layout: TableLayout, key: SparseColumn, bags: list[list[Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The lengths and ids (int64) of a transformed key's raw `bags` (one list per row)."""
    spec, learned = key.transform, layout.learned
    if key.history_times:
        assert key.sequence is not None
        history = layout.sparse[key.sequence]
        length = history.max_length or history.max_ids or 1
        times = learned.get(history.key).state.times_before([(bag[0][0], bag[0][1]) for bag in bags], length)
        return torch.tensor([len(row) for row in times], dtype=torch.long), torch.tensor(
            [int(time) for row in times for time in row], dtype=torch.long
        )
    assert key.rows is not None
    ones = torch.ones(len(bags), dtype=torch.long)
    if isinstance(spec, Cross):
        ids = transform(Cross.kind).apply(spec, {}, [bag[0] for bag in bags], key.rows)
        return ones, torch.tensor(ids, dtype=torch.long)
    if isinstance(spec, Quantiles):
        assert key.dense is not None
        feature, column = key.dense
        name = layout.dense[feature][0]
        numeric = layout.numeric[feature]
        fill = (
            0.0
            if not isinstance(numeric, Numeric) or numeric.fill is None
            else (learned.get(name).state["fill"][column] if numeric.fill == "mean" else float(numeric.fill))
        )
        raw = torch.tensor([bag[0] for bag in bags], dtype=torch.float64)
        return ones, _apply(learned, key.key, raw, fill).long()
    if isinstance(spec, History):
        assert key.of is not None
        length = key.max_length or key.max_ids or 1
        bags = _apply(learned, key.key, [(bag[0][0], bag[0][1]) for bag in bags], length)
        key = layout.sparse[key.of]  # the history's items map as its `of` feature's
    lengths = torch.tensor([len(bag) for bag in bags], dtype=torch.long)
    items = [item for bag in bags for item in bag]
    if isinstance(key.transform, Vocabulary):
        return lengths, torch.from_numpy(_apply(learned, key.key, items))
    assert key.rows is not None
    return lengths, torch.tensor([hash_id(item, key.rows) for item in items], dtype=torch.long)
