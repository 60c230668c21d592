"""`vocabulary`: ids learned from the training rows, the rest in OOV rows.

fit counts every value (a `|`-list's items each count once: a bag shares
its feature's vocabulary); partials add up. finish keeps the values seen at
least `min_count` times, most frequent first, ties by their text (so the
result is the same whatever order files or processes were read in), at most
`max_size` and at most the table's rows minus the OOV rows. Value k of the
kept list takes row `oov_buckets + k`; any other value takes row 0, or with
`oov_buckets: N` row hash(value) mod N. Values are compared as text: the
integer 12 of a Parquet column and the CSV field "12" are one value.

Both passes work a column at a time: fit counts an Arrow array with
`pyarrow.compute.value_counts` (a Python iterable with a Counter), apply
finds a chunk's values in the kept list with `pyarrow.compute.index_in`
(in C) and hashes only the values
it does not find.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runtime.config.transforms import Vocabulary
from runtime.features.hashing import hash_text

VERSION = 1


class VocabularyState:
    """The kept values in row order (after the OOV rows), and how many distinct values training had."""

    def __init__(self, values: Sequence[str], seen: int, oov_buckets: int) -> None:
        self.values = list(values)
        self.seen = seen
        self.oov_buckets = oov_buckets
        self.rows = {value: oov_buckets + k for k, value in enumerate(self.values)}
        self.lookup = pc.SetLookupOptions(pa.array(self.values, pa.string()))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its values (Arrow's lookup does not pickle): a data worker rebuilds the rest."""
        return VocabularyState, (self.values, self.seen, self.oov_buckets)

    def to_json(self) -> dict[str, Any]:
        return {"seen": self.seen, "oov_buckets": self.oov_buckets, "values": self.values}

    @staticmethod
    def from_json(data: dict[str, Any]) -> VocabularyState:
        return VocabularyState(data["values"], data["seen"], data["oov_buckets"])


class VocabularyTransform:
    kind, version = Vocabulary.kind, VERSION

    def fit(self, config: Vocabulary, raw: Iterable[str] | pa.Array) -> Counter[str]:
        if isinstance(raw, pa.Array):
            counts = pc.value_counts(raw)
            values, numbers = counts.field("values").to_pylist(), counts.field("counts").to_pylist()
            return Counter(dict(zip(values, numbers, strict=True)))
        return Counter(raw)

    def merge(self, config: Vocabulary, partials: Sequence[Counter[str]]) -> Counter[str]:
        total: Counter[str] = Counter()
        for partial in partials:
            total.update(partial)
        return total

    def finish(self, config: Vocabulary, partial: Counter[str], rows: int | None) -> VocabularyState:
        kept = sorted(
            (value for value, count in partial.items() if count >= config.min_count),
            key=lambda value: (-partial[value], value),
        )
        limits = [n for n in (config.max_size, None if rows is None else rows - config.oov_buckets) if n is not None]
        return VocabularyState(kept[: min(limits)] if limits else kept, len(partial), config.oov_buckets)

    def without_values(self, config: Vocabulary, partial: Counter[str]) -> str | None:
        """Whether no training row had a value (an empty vocabulary: every id out of it), or None."""
        return None if partial else "no training row has a value: the vocabulary is empty, every value is out of it"

    def dump(self, state: VocabularyState) -> dict[str, Any]:
        return state.to_json()

    def load(self, data: dict[str, Any]) -> VocabularyState:
        return VocabularyState.from_json(data)

    def describe(self, config: Vocabulary, state: VocabularyState) -> str:
        oov = f"{state.oov_buckets} OOV row{'s' if state.oov_buckets > 1 else ''}"
        kept = f"{len(state.values):,} values (of {state.seen:,} seen, min_count {config.min_count})"
        return f"vocabulary of {kept}, {oov}"

    def apply(self, config: Vocabulary, state: VocabularyState, raw: Sequence[str]) -> np.ndarray:
        """The rows of `raw`'s values, int64."""
        buckets = state.oov_buckets
        found = pc.index_in(pa.array(raw, pa.string()), options=state.lookup)
        rows = pc.fill_null(pc.add(found, buckets), -1).to_numpy(zero_copy_only=False).astype(np.int64)
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            rows[missing] = 0 if buckets == 1 else [hash_text(raw[i]) % buckets for i in missing.tolist()]
        return rows
