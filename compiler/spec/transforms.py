"""Semantic checks of the feature transforms learned from the data (runtime.features).

Called by `compiler.spec.semantic.resolve_features`: `check_sparse` on each
sparse entry as it is expanded (before tables are resolved: `num_embeddings:
auto` and `quantiles` give the table its rows), `check_dense` on each dense
entry, and `check_links` once features and tables are known (a history's
`of` feature and its table, a bucketized column's transform). The result is
runtime.config.transforms's frozen configs, which the IR carries as they are.

    vocabulary: {min_count: 2, max_size: 5000, oov_buckets: 1}   learned ids
    cross: [gender, occupation]                                  hashed combination of columns
    quantiles: 8 (with column: <dense feature>)                  learned equal-frequency buckets
    history: {of: movie, by: user, time: ts}                     earlier rows of the same key
    history: {..., where: {column: label, equals: 1}}            only those whose label is 1
    transform: {fill: mean, clip: [0, 100], log: true, scale: standardize}   (dense)
    history: {by: user, time: ts, aggregate: mean, of: label, last: 20}      (dense) earlier rows' mean
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compiler.spec.load import Node
from runtime.config.transforms import Aggregate, Cross, History, Numeric, Quantiles, Vocabulary

if TYPE_CHECKING:
    from compiler.spec.checker import Checker, _Sparse, _TableSpec

KEYS = ("vocabulary", "cross", "quantiles", "history")  # a sparse entry's transform keys
_ONE_ID = {  # keys a cross or bucketized feature must not have, and why
    "ids_per_sample": "it has one id per sample",
    "max_ids_per_sample": "it has one id per sample",
    "weighted": "it has no per-id weights",
    "hash": "its ids are rows already",
    "position_weights": "it has one id per sample",
}


def check_sparse(checker: Checker, entry: Node, fields: dict[str, Any], invalid: Any) -> None:
    """Per-entry rules; sets fields["transform"] (a config, None, or `invalid`) and fills in the
    rows of `num_embeddings: auto` (max_size + oov_buckets) and of `quantiles` (one per bucket)."""
    written = [key for key in (*KEYS, "boundaries") if checker.child(entry, key) is not None]
    fields["transform"] = None
    if len(written) > 1:
        node = checker.child(entry, written[1]) or entry
        checker.error(node, f"a feature takes its ids one way: {written[0]} or {written[1]}, not both", at_key=True)
        fields["transform"] = invalid
        return
    rows, rows_node = fields["num_embeddings"], checker.child(entry, "num_embeddings")
    if rows == "auto" and fields["vocabulary"] is None:
        checker.error(
            rows_node or entry,
            "num_embeddings: auto sizes the table from a vocabulary: give the feature `vocabulary` with its max_size",
        )
        fields["num_embeddings"] = invalid
    if isinstance(fields["vocabulary"], dict):
        fields["transform"] = _vocabulary(checker, entry, fields, invalid)
    elif isinstance(fields["cross"], list):
        fields["transform"] = _one_id(checker, entry, fields, "cross", Cross(tuple(fields["cross"])))
    elif isinstance(fields["quantiles"], int):
        fields["transform"] = _quantiles(checker, entry, fields)
    elif isinstance(fields["history"], dict):
        fields["transform"] = _history(checker, entry, fields)
    elif any(fields[key] is not None for key in KEYS):
        fields["transform"] = invalid  # rejected by the schema, reported there


def _vocabulary(checker: Checker, entry: Node, fields: dict[str, Any], invalid: Any) -> Vocabulary:
    spec = fields["vocabulary"]
    config = Vocabulary(spec.get("min_count", 1), spec.get("max_size"), spec.get("oov_buckets", 1))
    node = checker.child(entry, "vocabulary") or entry
    for key, why in (
        ("hash", "a vocabulary maps values to rows, hashing does not"),
        ("column", "the feature whose column this one reads maps the values"),
    ):
        if checker.child(entry, key) is not None:
            checker.error(checker.child(entry, key) or entry, f"{key} does not go with vocabulary: {why}", at_key=True)
    rows, rows_node = fields["num_embeddings"], checker.child(entry, "num_embeddings")
    if rows == "auto":
        if config.max_size is None:
            checker.error(
                rows_node or node,
                "num_embeddings: auto needs the vocabulary's max_size (the table's rows are max_size + oov_buckets)",
            )
            fields["num_embeddings"] = invalid
        else:
            fields["num_embeddings"] = config.max_size + config.oov_buckets
    elif isinstance(rows, int) and rows <= config.oov_buckets and rows_node is not None:
        checker.error(
            rows_node,
            f"num_embeddings {rows} leaves no row for the vocabulary beside its "
            f"{config.oov_buckets} OOV row{'s' if config.oov_buckets > 1 else ''}",
        )
    return config


def _one_id(checker: Checker, entry: Node, fields: dict[str, Any], key: str, config: Any) -> Any:
    for other, why in _ONE_ID.items():
        node = checker.child(entry, other)
        if node is not None:
            checker.error(node, f"{other} does not apply to a {key} feature: {why}", at_key=True)
    if fields["pooling"] == "none":
        checker.error(
            checker.child(entry, "pooling") or entry, f"a {key} feature is pooled (one id per sample), not a sequence"
        )
    if key == "cross" and checker.child(entry, "column") is not None:
        checker.error(
            checker.child(entry, "column") or entry, "a cross reads its `cross` columns; remove column", at_key=True
        )
    return config


def _quantiles(checker: Checker, entry: Node, fields: dict[str, Any]) -> Quantiles:
    config = _one_id(checker, entry, fields, "quantiles", Quantiles(fields["quantiles"]))
    if fields["column"] is None:
        node = checker.child(entry, "quantiles") or entry
        checker.error(node, "quantiles bucketize a numeric column: name the dense feature with `column`", at_key=True)
    rows, node = fields["num_embeddings"], checker.child(entry, "num_embeddings")
    if rows is None and checker.child(entry, "table") is None:
        fields["num_embeddings"] = config.buckets
    elif node is not None and isinstance(rows, int) and rows != config.buckets:
        checker.error(
            node,
            f"quantiles: {config.buckets} makes {config.buckets} buckets, so num_embeddings must be "
            f"{config.buckets} (got {rows}); or leave it out",
        )
    return config


def _history(checker: Checker, entry: Node, fields: dict[str, Any]) -> History:
    spec = fields["history"]
    node = checker.child(entry, "history") or entry
    if fields["pooling"] != "none":
        checker.error(node, "a history is a sequence: give the feature pooling: none and max_length", at_key=True)
    if checker.child(entry, "column") is not None:
        checker.error(
            checker.child(entry, "column") or entry,
            "a history reads its `of` feature's column; remove column",
            at_key=True,
        )
    where = spec.get("where")
    return History(spec["of"], spec["by"], spec["time"], None if where is None else (where["column"], where["equals"]))


def check_dense(checker: Checker, entry: Node) -> Numeric | Aggregate | None:
    """A dense entry's `transform` (with `history`: an Aggregate shaped by it), None without one (or when the
    schema rejected it)."""
    history = checker.child(entry, "history")
    if history is not None:
        return _aggregate(checker, entry, history)
    node = checker.child(entry, "transform")
    spec = checker.value(entry, "transform")
    if node is None or not isinstance(spec, dict) or node.path in checker.tainted:
        return None
    clip = spec.get("clip")
    if isinstance(clip, list) and len(clip) == 2 and not clip[0] < clip[1]:
        checker.error(
            checker.child(node, "clip") or node, f"the low end {clip[0]} must be below the high end {clip[1]}"
        )
    return Numeric(
        spec.get("fill"),
        tuple(clip) if isinstance(clip, list) else None,
        bool(spec.get("log", False)),
        spec.get("scale"),
    )


def _aggregate(checker: Checker, entry: Node, history: Node) -> Aggregate | None:
    spec = checker.value(entry, "history")
    if not isinstance(spec, dict) or history.path in checker.tainted:
        return None
    size = checker.child(entry, "size")
    if checker.value(entry, "size") not in (1, None):
        checker.error(size or entry, "a dense history makes one column: size must be 1")
    aggregate = spec["aggregate"]
    if aggregate == "mean" and "of" not in spec:
        checker.error(history, "aggregate: mean averages a column: name it with `of` (e.g. of: label)", at_key=True)
    if aggregate == "count" and "of" in spec:
        checker.error(checker.child(history, "of") or history, "aggregate: count counts rows; remove of", at_key=True)
    shaping = checker.value(entry, "transform")
    shaping = shaping if isinstance(shaping, dict) else {}
    if "fill" in shaping:
        node = checker.child(checker.child(entry, "transform"), "fill") or entry
        checker.error(node, "fill does not apply to a dense history: its aggregate is never empty", at_key=True)
    clip = shaping.get("clip")
    if isinstance(clip, list) and len(clip) == 2 and not clip[0] < clip[1]:
        node = checker.child(checker.child(entry, "transform"), "clip") or entry
        checker.error(node, f"the low end {clip[0]} must be below the high end {clip[1]}")
    return Aggregate(
        tuple(spec["by"]) if isinstance(spec["by"], list) else spec["by"],
        spec["time"],
        aggregate,
        spec.get("of") if aggregate == "mean" else None,
        spec.get("last"),
        spec.get("sharing"),
        tuple(clip) if isinstance(clip, list) else None,
        bool(shaping.get("log", False)),
        shaping.get("scale"),
    )


def check_links(
    checker: Checker,
    sparse: list[_Sparse],
    transformed_dense: set[str],
    tables: dict[str, _TableSpec],
    aggregates: frozenset[str] = frozenset(),
) -> None:
    """Rules between features: a history's `of` is a single-id pooled feature on the history's table;
    fixed `boundaries` do not read a transformed dense feature (they would cut the scaled values)."""
    by_name = {feature.name: feature for feature in sparse}
    table_of = {name: spec.name for spec in tables.values() for name in spec.features}
    for feature in sparse:
        config = feature.fields.get("transform")
        if isinstance(feature.fields["boundaries"], list) and feature.fields["column"] in transformed_dense:
            node = checker.child(feature.entry, "boundaries") or feature.entry
            checker.error(
                node,
                f"boundaries cut the raw values of a dense feature without a transform; "
                f"'{feature.fields['column']}' has one: use quantiles, or bucketize another "
                "dense feature",
                at_key=True,
            )
        if isinstance(config, Quantiles) and feature.fields["column"] in aggregates:
            checker.error(
                checker.child(feature.entry, "column") or feature.entry,
                f"'{feature.fields['column']}' is a dense history, made from earlier rows, not a column: quantiles "
                "bucketize a column the data maps",
            )
        if not isinstance(config, History):
            continue
        node = checker.child(checker.child(feature.entry, "history") or feature.entry, "of") or feature.entry
        of = by_name.get(config.of)
        if of is None:
            checker.error(node, f"unknown sparse feature '{config.of}'{checker.suggest(config.of, by_name)}")
            continue
        single = (
            of.fields["pooling"] != "none"
            and of.fields["max_ids_per_sample"] is None
            and of.fields["ids_per_sample"] in (None, 1)
            and not isinstance(of.fields["transform"], (History, Cross))
        )
        if not single or of.fields["column"] is not None:
            checker.error(
                node,
                f"'{config.of}' is not a single-id feature of its own column; a history is made of one value per row",
            )
        elif None not in (table_of.get(of.name), table_of.get(feature.name)) and (
            table_of.get(of.name) != table_of.get(feature.name)
        ):
            checker.error(
                node,
                f"the history looks its ids up in the table of '{config.of}' "
                f"('{table_of.get(of.name)}'), not in '{table_of.get(feature.name)}': "
                f"give it table: {table_of.get(of.name)}",
            )


def check_where(checker: Checker, root: Node, sparse: list[_Sparse]) -> None:
    """A history's `where` column is one the data maps to a number (a label or a dense feature, not a sparse
    one): learning reads it beside the history's own columns, and compares it as a number."""
    mapped = checker.value(checker.child(root, "data"), "columns")
    mapped = mapped if isinstance(mapped, dict) else {}
    sparse_names = {feature.name for feature in sparse}
    for feature in sparse:
        config = feature.fields.get("transform")
        if not isinstance(config, History) or config.where is None:
            continue
        history = checker.child(feature.entry, "history")
        node = checker.child(checker.child(history, "where"), "column") or history or feature.entry
        column = config.where[0]
        target = mapped.get(column)
        if target is None:
            checker.error(
                node,
                f"column '{column}' is not in data.columns; `where` compares a column the data maps "
                "to a label or a dense feature",
            )
        elif target in sparse_names:
            checker.error(
                node,
                f"column '{column}' feeds sparse feature '{target}', not a number; `where` compares "
                "a column the data maps to a label or a dense feature",
            )


def check_dense_histories(checker: Checker, root: Node, dense: list[Any], sparse: list[_Sparse]) -> None:
    """A dense history's `of` is a column the data maps to a number (a label or a dense feature, not a sparse
    one): learning reads it from the training rows and averages it. No column feeds a dense history."""
    aggregates = {feature.name for feature in dense if isinstance(feature.transform, Aggregate)}
    for column, fed in checker.pairs(checker.child(root, "data"), "columns"):
        if fed.value in aggregates:
            checker.error(
                fed,
                f"column '{column}' feeds dense feature '{fed.value}', which its history makes from earlier "
                "rows; remove the column",
            )
    mapped = checker.value(checker.child(root, "data"), "columns")
    mapped = mapped if isinstance(mapped, dict) else {}
    sparse_names = {feature.name for feature in sparse}
    entries = {checker.name(entry): entry for entry in checker.entries(checker.child(root, "features"), "dense")}
    for feature in dense:
        config = feature.transform
        if not isinstance(config, Aggregate) or config.of is None:
            continue
        history = checker.child(entries[feature.name], "history")
        node = checker.child(history, "of") or history or entries[feature.name]
        target = mapped.get(config.of)
        if target is None:
            checker.error(
                node,
                f"column '{config.of}' is not in data.columns; `of` averages a column the data maps to a label "
                "or a dense feature",
            )
        elif target in sparse_names:
            checker.error(
                node,
                f"column '{config.of}' feeds sparse feature '{target}', not a number; `of` averages a column the "
                "data maps to a label or a dense feature",
            )


def check_reader(checker: Checker, root: Node, sparse: list[_Sparse], transformed_dense: set[str]) -> None:
    """Learned transforms read raw csv or parquet fields (prepared data stores their result)."""
    data = checker.child(root, "data")
    reader = checker.value(data, "reader") if data is not None else None
    learned = [f.name for f in sparse if f.fields.get("transform") is not None] + sorted(transformed_dense)
    if learned and reader in ("criteo", "movielens"):
        node = checker.child(data, "reader") or data
        checker.error(
            node,
            f"feature '{learned[0]}' has a transform learned from csv or parquet columns; "
            f"the {reader} reader has its own columns: use reader csv or parquet",
        )
