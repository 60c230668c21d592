"""`vocabulary`: ids learned from the training rows, the rest in OOV rows.

fit counts every value (a `|`-list's items each count once: a bag shares
its feature's vocabulary); partials add up. finish keeps the values seen at
least `min_count` times, most frequent first, ties by their text (so the
result is the same whatever order files or processes were read in), at most
`max_size` and at most the table's rows minus the OOV rows. Value k of the
kept list takes row `oov_buckets + k`; any other value takes row 0, or with
`oov_buckets: N` row hash(value) mod N. Values are compared as text: the
integer 12 of a Parquet column and the CSV field "12" are one value.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence

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

    def to_json(self) -> dict[str, Any]:
        return {"seen": self.seen, "oov_buckets": self.oov_buckets, "values": self.values}

    @staticmethod
    def from_json(data: dict[str, Any]) -> VocabularyState:
        return VocabularyState(data["values"], data["seen"], data["oov_buckets"])


class VocabularyTransform:
    kind, version = Vocabulary.kind, VERSION

    def fit(self, config: Vocabulary, raw: Iterable[str]) -> Counter[str]:
        return Counter(raw)

    def merge(self, config: Vocabulary, partials: Sequence[Counter[str]]) -> Counter[str]:
        total: Counter[str] = Counter()
        for partial in partials:
            total.update(partial)
        return total

    def finish(self, config: Vocabulary, partial: Counter[str], rows: int | None) -> VocabularyState:
        kept = sorted((value for value, count in partial.items() if count >= config.min_count),
                      key=lambda value: (-partial[value], value))  # fmt: skip
        limits = [n for n in (config.max_size, None if rows is None else rows - config.oov_buckets) if n is not None]
        return VocabularyState(kept[: min(limits)] if limits else kept, len(partial), config.oov_buckets)

    def dump(self, state: VocabularyState) -> dict[str, Any]:
        return state.to_json()

    def load(self, data: dict[str, Any]) -> VocabularyState:
        return VocabularyState.from_json(data)

    def describe(self, config: Vocabulary, state: VocabularyState) -> str:
        oov = f"{state.oov_buckets} OOV row{'s' if state.oov_buckets > 1 else ''}"
        kept = f"{len(state.values):,} values (of {state.seen:,} seen, min_count {config.min_count})"
        return f"vocabulary of {kept}, {oov}"

    def apply(self, config: Vocabulary, state: VocabularyState, raw: Sequence[str]) -> list[int]:
        rows, buckets = state.rows, state.oov_buckets
        if buckets == 1:
            return [rows.get(value, 0) for value in raw]
        return [rows[value] if value in rows else hash_text(value) % buckets for value in raw]
