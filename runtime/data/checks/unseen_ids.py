"""Ids outside the vocabulary: counted per feature and reported, never sent to row 0 silently.

A MovieLens vocabulary (runtime.data.movielens.vocab) gives each user and
movie id it was built from a row from 1 up; an id it has not seen (a new
user in an evaluation split, a new movie in the file `predict` scores) is
looked up in row 0, which is kept for them. Row 0 is trained only by such
ids, so with the vocabulary built from the training file it keeps its
initial values, and an unseen id is scored with those.

`UnseenIds` counts, per feature, the ids that went to row 0 in the rows it
is shown. Training counts its global batches (every rank the same rows, as
for bad rows: no reduction), evaluation each pass, `predict` every scored
row:

    unseen = UnseenIds(("user_id", "movie_id"))
    unseen.add(columns)      # 120 rows, 17 of them with a movie id not in the vocabulary
    unseen.describe()        # ->
    'ids not in the training vocabulary (row 0): user_id 0, movie_id 17 of 120 rows'
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from runtime.data.columns import Columns


class UnseenIds:
    """Per feature, how many ids of the rows added were outside the vocabulary (row 0, or the first
    `oov_rows[feature]` rows: a learned vocabulary's OOV rows, runtime.features.vocabulary)."""

    def __init__(self, features: Sequence[str], oov_rows: Mapping[str, int] | None = None) -> None:
        self.counts: dict[str, int] = dict.fromkeys(features, 0)
        self.oov_rows = {feature: (oov_rows or {}).get(feature, 1) for feature in features}
        self.rows = 0

    def add(self, columns: Columns) -> None:
        """Count the OOV-row ids of `columns`' vocabulary features."""
        self.rows += len(columns)
        for feature in self.counts:
            values = columns.sparse[feature].values
            self.counts[feature] += int(torch.count_nonzero(values < self.oov_rows[feature]))

    def describe(self) -> str:
        """The counts as one human-readable phrase."""
        counts = ", ".join(f"{feature} {count:,}" for feature, count in self.counts.items())
        where = "row 0" if all(rows == 1 for rows in self.oov_rows.values()) else "the OOV rows"
        return f"ids not in the training vocabulary ({where}): {counts} of {self.rows:,} rows"


def unseen_counter(reader: Any) -> UnseenIds | None:
    """A counter for the vocabulary features of `reader` (a runtime.data.loader.Reader), None without any."""
    features = reader.unseen_features
    return UnseenIds(features, getattr(reader, "oov_rows", None)) if features else None
