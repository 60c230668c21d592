"""Semantic checks of where a sparse feature's ids come from: `column`, `boundaries`, `position_weights`.

Called by `compiler.spec.semantic.resolve_features`: `check_entry` on each
sparse entry as it is expanded (before tables are resolved, since a
bucketized feature's table takes its rows from its boundaries),
`resolve_columns` once all features are known (before their IR is built:
a feature reading another's column inherits its bag size, weights and
hashing), and `check_column_rows` once tables are resolved.

    column: cat          wide_i reads cat_i's ids (count expands alike)
    column: age          with boundaries: age's column i, bucketized
    position_weights     learned per-position weights (needs max_ids_per_sample)
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compiler.spec.load import Node

if TYPE_CHECKING:
    from compiler.spec.checker import Checker, _Sparse, _TableSpec

INHERITED = ("ids_per_sample", "max_ids_per_sample", "weighted", "hash")  # from the column's feature
_NOT_BUCKETIZED = {  # keys a bucketized feature must not have
    "ids_per_sample": "a bucketized feature has one id per sample",
    "max_ids_per_sample": "a bucketized feature has one id per sample",
    "weighted": "a bucketized feature has no per-id weights",
    "hash": "bucket ids are row numbers already",
    "position_weights": "a bucketized feature has one id per sample",
    "max_length": "a bucketized feature is pooled",
}


@dataclass(frozen=True, slots=True)
class Source:
    """Where a feature's ids come from: another feature's column, or a dense column bucketized."""

    column: str | None  # None: the feature's own column
    index: int = 0
    boundaries: tuple[float, ...] = ()


def check_entry(checker: Checker, entry: Node, fields: dict[str, Any]) -> None:
    """Per-entry rules; fills in a bucketized feature's num_embeddings (len(boundaries) + 1)."""
    boundaries, column = fields["boundaries"], fields["column"]
    if boundaries is not None and not isinstance(boundaries, list):  # rejected by the schema, reported there
        if fields["num_embeddings"] is None:
            fields["num_embeddings"] = boundaries  # unknown rows: no table error on top
        return
    if isinstance(boundaries, list):
        _check_boundaries(checker, entry, boundaries, fields)
        if column is None:
            checker.error(
                checker.child(entry, "boundaries") or entry,
                "boundaries bucketize a numeric column: name the dense feature with `column`",
                at_key=True,
            )
    elif isinstance(column, str):
        for key in INHERITED:
            node = checker.child(entry, key)
            if node is not None:
                message = f"{key} comes from the feature whose column this one reads ('{column}'); remove it here"
                checker.error(node, message, at_key=True)
    if fields["position_weights"] is True:
        node = checker.child(entry, "position_weights") or entry
        if fields["pooling"] == "none":
            checker.error(node, "position_weights applies to pooled features only; this is a sequence", at_key=True)
        elif fields["weighted"] is True:
            checker.error(node, "position_weights replace per-id weights; this feature is weighted", at_key=True)
        elif column is None and fields["max_ids_per_sample"] is None:
            checker.error(node, "position_weights needs max_ids_per_sample (the positions to weight)", at_key=True)


def _check_boundaries(checker: Checker, entry: Node, boundaries: list[Any], fields: dict[str, Any]) -> None:
    items = checker.entries(entry, "boundaries")
    for index in range(1, len(boundaries)):
        low, high = boundaries[index - 1], boundaries[index]
        if not (isinstance(low, (int, float)) and isinstance(high, (int, float))):
            continue
        if not high > low:
            message = (
                f"boundaries must be strictly increasing: boundaries[{index}] = {high} is not greater than "
                f"boundaries[{index - 1}] = {low}"
            )
            checker.error(items[index], message)
            break
        if not _float32(high) > _float32(low):  # dense values are float32: one bucket could never be hit
            message = (
                f"boundaries[{index}] = {high} and boundaries[{index - 1}] = {low} are the same float32 "
                f"({_float32(high)!r}), the precision dense values are compared in"
            )
            checker.error(items[index], message)
            break
    for key, why in _NOT_BUCKETIZED.items():
        node = checker.child(entry, key)
        if node is not None:
            checker.error(node, f"{key} does not apply to a bucketized feature: {why}", at_key=True)
    if fields["pooling"] == "none":
        node = checker.child(entry, "pooling") or entry
        checker.error(node, "a bucketized feature is pooled (one id per sample), not a sequence")
    rows, node = fields["num_embeddings"], checker.child(entry, "num_embeddings")
    if rows is None and checker.child(entry, "table") is None:
        fields["num_embeddings"] = len(boundaries) + 1
    elif node is not None and isinstance(rows, int) and rows != len(boundaries) + 1:
        buckets = len(boundaries) + 1
        message = (
            f"{len(boundaries)} boundaries make {buckets} buckets, so num_embeddings must be {buckets} "
            f"(got {rows}); or leave it out"
        )
        checker.error(node, message)


def resolve_columns(checker: Checker, sparse: list[_Sparse], dense_sizes: dict[str, int | None]) -> dict[str, Source]:
    """Each feature's source; a feature reading another's column takes that feature's ids keys."""
    by_name = {feature.name: feature for feature in sparse}
    sources: dict[str, Source] = {}
    reported: set[tuple] = set()

    def once(node: Node, message: str) -> None:
        if (node.path, message) not in reported:
            reported.add((node.path, message))
            checker.error(node, message)

    counts: dict[tuple, int] = {}
    for feature in sparse:
        counts[feature.entry.path] = counts.get(feature.entry.path, 0) + 1
    for feature in sparse:
        column, node = feature.fields["column"], checker.child(feature.entry, "column")
        if not isinstance(column, str) or node is None:
            sources[feature.name] = Source(None)
            continue
        counted = feature.written != feature.name
        index = int(feature.name.rpartition("_")[2]) if counted else 0
        boundaries = feature.fields["boundaries"]
        if boundaries is not None and not isinstance(boundaries, list):
            continue  # rejected by the schema: no source, no IR
        if isinstance(boundaries, list) or isinstance(feature.fields["quantiles"], int):
            source = _dense_source(column, node, counts[feature.entry.path], dense_sizes, once, checker, index)
            if source is not None:  # quantiles: boundaries learned from the data (compiler.spec.transforms)
                sources[feature.name] = Source(column, index, tuple(float(b) for b in boundaries or ()))
            continue
        target = f"{column}_{index}" if counted else column
        if target == feature.name:
            sources[feature.name] = Source(None)
            continue
        problem = _sparse_problem(target, column, by_name, dense_sizes, checker)
        if problem is not None:
            once(node, problem)
            continue
        own = by_name[target]
        feature.fields = {**feature.fields, **{key: own.fields[key] for key in INHERITED}}
        if feature.fields["position_weights"] is True:
            at = checker.child(feature.entry, "position_weights") or feature.entry
            if feature.fields["weighted"] is True:
                once(at, f"position_weights replace per-id weights; the column's feature '{target}' is weighted")
            elif feature.fields["max_ids_per_sample"] is None:
                once(at, f"position_weights needs max_ids_per_sample, which '{target}' (its column) does not set")
        sources[feature.name] = Source(target)
    return sources


def _dense_source(
    column: str, node: Node, count: int, dense_sizes: dict[str, int | None], once: Any, checker: Checker, index: int
) -> Source | None:
    if column not in dense_sizes:
        hint = checker.suggest(column, dense_sizes)
        once(node, f"column '{column}' is not a dense feature (boundaries bucketize a numeric column){hint}")
        return None
    size = dense_sizes[column]
    if isinstance(size, int) and size != count:
        entries = f"count {count}" if count > 1 else "no count"
        once(
            node,
            f"dense feature '{column}' has {size} columns but this entry bucketizes {count} ({entries}); "
            f"give it count: {size} (one feature per column)",
        )
        return None
    return Source(column, index)


def _sparse_problem(
    target: str, column: str, by_name: dict[str, _Sparse], dense_sizes: dict[str, int | None], checker: Checker
) -> str | None:
    if target in dense_sizes or column in dense_sizes:
        return f"column '{column}' is a dense feature: give boundaries to bucketize it"
    if target not in by_name:
        hint = checker.suggest(target, by_name)
        return f"unknown column '{target}': name a sparse feature whose ids this one reads{hint}"
    own = by_name[target]
    if own.fields["pooling"] == "none":
        return f"column '{target}' is a sequence feature; only a pooled feature's ids can feed another table"
    if isinstance(own.fields["column"], str) and checker.child(own.entry, "column") is not None:
        return f"'{target}' reads column '{own.fields['column']}' itself; name the column directly"
    return None


def check_column_rows(
    checker: Checker, sparse: list[_Sparse], sources: dict[str, Source], tables: dict[str, _TableSpec]
) -> None:
    """A feature reading another's ids needs a table of as many rows (the same ids index both); a
    bucketized feature's shared table needs one row per bucket."""
    by_feature = {name: spec for spec in tables.values() for name in spec.features}
    reported: set[tuple] = set()
    for feature in sparse:
        source = sources.get(feature.name)
        if source is not None and source.boundaries:
            _check_bucket_rows(checker, feature, by_feature.get(feature.name), len(source.boundaries) + 1, reported)
        if source is None or source.column is None or source.boundaries:
            continue
        mine, theirs = by_feature.get(feature.name), by_feature.get(source.column)
        if mine is None or theirs is None or not isinstance(mine.rows, int) or not isinstance(theirs.rows, int):
            continue
        node = checker.child(feature.entry, "column")
        if mine.rows != theirs.rows and node is not None and node.path not in reported:
            reported.add(node.path)
            checker.error(
                node,
                f"feature '{feature.name}' reads the ids of '{source.column}', whose table '{theirs.name}' has "
                f"{theirs.rows} rows, but its own table '{mine.name}' has {mine.rows}; "
                "tables that share ids need the same num_embeddings",
            )


def _check_bucket_rows(
    checker: Checker, feature: _Sparse, table: _TableSpec | None, buckets: int, reported: set
) -> None:
    node = checker.child(feature.entry, "table")
    if table is None or node is None or not isinstance(table.rows, int) or table.rows == buckets:
        return
    if node.path not in reported:
        reported.add(node.path)
        checker.error(
            node,
            f"{buckets - 1} boundaries make {buckets} buckets, but the shared table '{table.name}' has "
            f"{table.rows} rows",
        )


def _float32(value: float) -> float:
    """`value` rounded to the nearest float32 (inf beyond its range)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
