"""What the readers need to know about a spec: features, table sizes, labels, the column map.

Readers take the generated module's SPEC dict (the runtime never imports
the compiler). The spec's `data.columns` maps reader columns to features
or head labels; it applies when the spec's `data.reader` is the reader in
use, and columns it does not list keep the reader's default mapping.
"""

from __future__ import annotations

from typing import Any, Mapping

from runtime.data.errors import DataError

Spec = Mapping[str, Any]


def explicit_columns(spec: Spec, reader: str, known: tuple[str, ...]) -> dict[str, str]:
    """The spec's `data.columns` for `reader` (column -> target); unknown columns are errors."""
    data = spec.get("data")
    if not data or data.get("reader") != reader:
        return {}
    columns = dict(data.get("columns") or {})
    for column in columns:
        if column not in known:
            raise DataError(
                f"data.columns: {column!r} is not a {reader} column (the {reader} columns: {', '.join(known)})"
            )
    return columns


def table_rows(spec: Spec) -> dict[str, int]:
    """Sparse feature name -> the number of rows of the table it looks up."""
    rows = {table["name"]: table["num_embeddings"] for table in spec["tables"]}
    return {feature["name"]: rows[feature["table"]] for feature in spec["sparse"]}


def is_weighted(spec: Spec) -> bool:
    """Whether batches carry per-id weights (as soon as one sparse feature is weighted)."""
    return any(feature["weighted"] for feature in spec["sparse"])


def heads_by_label(spec: Spec) -> dict[str, Mapping[str, Any]]:
    """Label column -> the first head that reads it."""
    heads: dict[str, Mapping[str, Any]] = {}
    for head in spec["heads"]:
        heads.setdefault(head["label"], head)
    return heads


def check_labels_fed(spec: Spec, reader: str, fed: set[str]) -> None:
    """Every head's label must come from some column of the reader."""
    for head in spec["heads"]:
        if head["label"] not in fed:
            raise DataError(
                f"head {head['name']!r} reads label {head['label']!r}, which no {reader} column feeds "
                f"(map a column to it in data.columns)"
            )


def feature_list(names: list[str], limit: int = 4) -> str:
    """`a, b, c` or `a, b, ..., z` for messages."""
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[: limit - 1]) + f", ..., {names[-1]}"
