"""A warning when a sequence feature's histories are much longer (or shorter) in evaluation than in training.

A model trained on short histories and measured on long ones (every
evaluation row with the user's whole past, training rows with the first
few items) is measured on inputs it never saw: DIN scored worse with such a
history than without it. Before training, `reccompile train --eval-data`
compares each sequence feature's mean history length over the training
rows and the evaluation rows, and warns when they are more than RATIO
apart, naming the feature and both figures. The mean comes from a prepared
directory's column statistics (every row), or from the first SAMPLE_ROWS
good rows of a raw file (its order, so a file sorted by time measures its
beginning).

>>> length_warnings({"history": 3.0}, {"history": 41.5}, "movielens:train", "movielens:test")
["sequence feature 'history': its mean length is 41.5 in the evaluation rows (movielens:test) but 3.0 in the training rows (movielens:train), more than 2x apart: the model is measured on histories unlike the ones it trained on"]
"""

from __future__ import annotations

from typing import Any, Mapping

from runtime.config.data import ModelInputs
from runtime.data.errors import RowError

__all__ = ["RATIO", "SAMPLE_ROWS", "length_warnings", "prepared_lengths", "reader_lengths", "sequence_features"]

RATIO = 2.0
SAMPLE_ROWS = 10_000


def sequence_features(inputs: ModelInputs) -> tuple[str, ...]:
    """The sparse features that are sequences (a max_length: histories), but a next-item head's own
    sequence: every position of a training sequence is trained, so its prefixes are the short
    histories, and a row's whole length says nothing."""
    next_item = {head.label for head in inputs.heads if head.loss == "sampled_softmax"}
    return tuple(f.name for f in inputs.sparse if f.max_length is not None and f.name not in next_item)


def reader_lengths(reader: Any, features: tuple[str, ...], rows: int = SAMPLE_ROWS) -> dict[str, float]:
    """Each feature's mean length over the first `rows` good rows of a line reader (bad rows skipped)."""
    parsed = []
    for _, _, line in reader.epoch_lines():
        try:
            parsed.append(reader.parse(line))
        except RowError:
            continue
        if len(parsed) == rows:
            break
    if not parsed:
        return {}
    columns = reader.to_columns(parsed)
    return {name: float(columns.sparse[name].lengths.double().mean()) for name in features if name in columns.sparse}


def prepared_lengths(columns: Mapping[str, Mapping[str, Any]], features: tuple[str, ...]) -> dict[str, float]:
    """Each feature's mean length over every row of prepared data (its manifest's column statistics)."""
    means = {}
    for name in features:
        stats = columns.get(f"sparse.{name}", {}).get("stats", {})
        if stats.get("rows"):
            means[name] = stats["values"] / stats["rows"]
    return means


def length_warnings(
    training: Mapping[str, float], evaluation: Mapping[str, float], train_source: str, eval_source: str
) -> list[str]:
    """One warning per feature whose mean lengths differ by more than RATIO (one of them 0 and the other not, too)."""
    warnings = []
    for name in training.keys() & evaluation.keys():
        trained, evaluated = training[name], evaluation[name]
        low, high = sorted((trained, evaluated))
        if high > 0 and high > RATIO * low:
            warnings.append(
                f"sequence feature {name!r}: its mean length is {evaluated:.1f} in the evaluation rows ({eval_source}) "
                f"but {trained:.1f} in the training rows ({train_source}), more than {RATIO:g}x apart: the model is "
                "measured on histories unlike the ones it trained on"
            )
    return sorted(warnings)
