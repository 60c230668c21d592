"""What the readers need to know about a spec: features, table sizes, labels, the column map.

Readers take the generated module's `ModelInputs` (runtime.config.data;
the runtime never imports the compiler). The spec's `data.columns` maps reader columns to features
or head labels; it applies when the spec's `data.reader` is the reader in
use, and columns it does not list keep the reader's default mapping.
"""

from __future__ import annotations

from runtime.config.data import ModelInputs
from runtime.config.heads import HeadConfig
from runtime.data.errors import DataError


def explicit_columns(inputs: ModelInputs, reader: str, known: tuple[str, ...]) -> dict[str, str]:
    """The spec's `data.columns` for `reader` (column -> target); unknown columns are errors."""
    data = inputs.data
    if data is None or data.reader != reader:
        return {}
    columns = dict(data.columns)
    for column in columns:
        if column not in known:
            raise DataError(
                f"data.columns: {column!r} is not a {reader} column (the {reader} columns: {', '.join(known)})"
            )
    return columns


def table_rows(inputs: ModelInputs) -> dict[str, int]:
    """Sparse feature name -> the number of rows of the table it looks up."""
    return {feature.name: feature.num_embeddings for feature in inputs.sparse}


def is_weighted(inputs: ModelInputs) -> bool:
    """Whether batches carry per-id weights (as soon as one sparse feature is weighted)."""
    return any(feature.weighted for feature in inputs.sparse)


def heads_by_label(inputs: ModelInputs) -> dict[str, HeadConfig]:
    """Label column -> the first head that reads it (a sampled_softmax head reads none)."""
    heads: dict[str, HeadConfig] = {}
    for head in inputs.heads:
        if head.loss != "sampled_softmax":
            heads.setdefault(head.label, head)
    return heads


def check_labels_fed(inputs: ModelInputs, reader: str, fed: set[str]) -> None:
    """Every head's label must come from some column of the reader (a sampled_softmax head reads none)."""
    for head in inputs.heads:
        if head.label not in fed and head.loss != "sampled_softmax":
            raise DataError(
                f"head {head.name!r} reads label {head.label!r}, which no {reader} column feeds "
                f"(map a column to it in data.columns)"
            )


def feature_list(names: list[str], limit: int = 4) -> str:
    """`a, b, c` or `a, b, ..., z` for messages."""
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[: limit - 1]) + f", ..., {names[-1]}"
