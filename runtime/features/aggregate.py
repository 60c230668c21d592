"""`aggregate`: a dense feature made from the earlier training rows of the same key (a dense `history`).

`history: {by: user, time: ts, of: label, last: 20, aggregate: mean, sharing: genres}`
on a dense feature of size 1 gives, for a row of key k (its `by` value; with
`by: [movie, gender]` the pair of its values, `composite_key`) at
time t, over the training rows of k with a time strictly below t (the same
rows a sparse `history` takes, runtime.features.history: a training row with
the same time is never counted, whichever comes first in the file):

  last: N         only the N most recent of them (by time, file order among ties);
  sharing: col    then only those whose `col` (a `|`-list) has a value in common
                  with the row's own `col` (a row with an empty `col` shares none);
  aggregate       mean: the mean of their `of` values (a column the data maps to a
                  label or a dense feature, read as a number; a training row with an
                  empty `of` is left out); count: how many they are.

An empty set gives the default: for mean, the mean of `of` over all training
rows (learned), for count 0. Then the value is clipped, logged and scaled as
a `numeric` transform would (runtime.features.numeric), the mean and std (or
min and max) being those of the training rows' own aggregates.

The state is the training rows (per key, sorted by time: their times, `of`
values and `sharing` values), so training, evaluation, predict and serving
rows all take the same function of (key, time, sharing values): a training
row sees the training rows before it; an evaluation, predict or request row
sees every training row before its time (an empty time: all of them). `of`
is read from the training rows only, while learning: the label of an
evaluation row or a request never enters any aggregate.

Cost: `apply` is vectorised over a batch (numpy): without `sharing` two binary
searches and a prefix sum per row; with it, one bit test per (row, earlier row
in its window), so `last` bounds it. The `sharing` values are bits of a mask
(64 per word), learned from the training rows; a value no training row has
shares with none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from runtime.config.transforms import Aggregate, Numeric
from runtime.features.numeric import NumericTransform

VERSION = 1
_CHUNK = 8192  # training rows aggregated at once in `finish` (bounds the pair arrays with `sharing`)

# One training row while learning: (key, time, sharing values, `of` value (NaN when empty or no `of`)).
Event = tuple


def composite_key(parts: Sequence[Any]) -> str:
    """The key of a row whose `by` names several columns: their values as text (empty for a missing one),
    joined by a separator no CSV field or id holds, so (a, bc) and (ab, c) stay apart."""
    return "\x1f".join("" if part is None else str(part) for part in parts)


def numeric_of(config: Aggregate) -> Numeric:
    """The `numeric` shaping applied after the aggregate."""
    return Numeric(None, config.clip, config.log, config.scale)


class AggregateState:
    """The training rows sorted by (key, time): the arrays `apply` searches, and the learned default and shaping."""

    def __init__(
        self,
        keys: list[str],
        counts: list[int],
        times: list[float],
        values: list[float],
        shared: list[list[str]] | None,
        vocabulary: list[str],
        default: float,
        numeric: dict[str, list[float]] | None = None,
    ) -> None:
        self.keys, self.counts, self.shared, self.vocabulary = keys, counts, shared, vocabulary
        self.times_list, self.values_list, self.default, self.numeric = times, values, default, numeric
        self.index = {key: i for i, key in enumerate(keys)}
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)
        self.times = np.asarray(times, dtype=np.float64)
        values_array = np.asarray(values, dtype=np.float64)
        self.present = ~np.isnan(values_array)
        self.values = np.where(self.present, values_array, 0.0)
        self.value_sums = np.concatenate([[0.0], np.cumsum(self.values)])
        self.present_sums = np.concatenate([[0], np.cumsum(self.present)]).astype(np.int64)
        # (key, time) as one sorted int64: key * (distinct times + 1) + the time's rank among them
        self.moments = np.unique(self.times)
        key_of_row = np.repeat(np.arange(len(keys), dtype=np.int64), np.asarray(counts, dtype=np.int64))
        self.stride = len(self.moments) + 1
        self.positions = key_of_row * self.stride + np.searchsorted(self.moments, self.times)
        self.bits = {value: i for i, value in enumerate(vocabulary)}
        self.masks = self._masks(shared) if shared is not None else None

    def _masks(self, sets: Sequence[Sequence[str]]) -> np.ndarray:
        """[len(sets), words] uint64: the bits of each set's values (values outside the vocabulary: none)."""
        words = max(1, math.ceil(len(self.vocabulary) / 64))
        masks = np.zeros((len(sets), words), dtype=np.uint64)
        rows, bits = [], []
        for row, values in enumerate(sets):
            for value in values:
                bit = self.bits.get(value)
                if bit is not None:
                    rows.append(row)
                    bits.append(bit)
        if rows:
            bit_array = np.asarray(bits, dtype=np.int64)
            np.bitwise_or.at(
                masks,
                (np.asarray(rows, dtype=np.int64), bit_array // 64),
                np.left_shift(np.uint64(1), (bit_array % 64).astype(np.uint64)),
            )
        return masks

    def raw(self, config: Aggregate, rows: Sequence[tuple[str, float, Sequence[str]]]) -> np.ndarray:
        """Per row (key, time, sharing values): the aggregate before clip, log and scale (float64)."""
        n = len(rows)
        key = np.fromiter((self.index.get(row[0], -1) for row in rows), dtype=np.int64, count=n)
        time = np.fromiter((row[1] for row in rows), dtype=np.float64, count=n)
        known = key >= 0
        safe = np.where(known, key, 0)
        start = self.offsets[safe]
        end = np.searchsorted(self.positions, safe * self.stride + np.searchsorted(self.moments, time), side="left")
        end = np.where(known, end, start)
        if config.last is not None:
            start = np.maximum(start, end - config.last)
        if config.sharing is None and config.aggregate == "count":
            count, total = (end - start).astype(np.float64), None
        elif config.sharing is None:
            count = (self.present_sums[end] - self.present_sums[start]).astype(np.float64)
            total = self.value_sums[end] - self.value_sums[start]
        else:
            count, total = self._shared(config, rows, start, end)
        if config.aggregate == "count":
            return count
        return np.where(count > 0, total / np.where(count > 0, count, 1.0), self.default)

    def _shared(
        self, config: Aggregate, rows: Sequence[tuple[str, float, Sequence[str]]], start: np.ndarray, end: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The count (of rows with an `of` value, for mean) and the sum of the window's rows sharing a value."""
        assert self.masks is not None
        n = len(rows)
        lengths = end - start
        pairs = int(lengths.sum())
        if pairs == 0:
            return np.zeros(n), np.zeros(n)
        owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
        earlier = np.arange(pairs, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        earlier += np.repeat(start, lengths)
        own = self._masks([row[2] for row in rows])
        shares = (self.masks[earlier] & own[owner]).any(axis=1)
        if config.aggregate == "mean":
            shares &= self.present[earlier]
        count = np.bincount(owner, weights=shares.astype(np.float64), minlength=n)
        total = np.bincount(owner, weights=np.where(shares, self.values[earlier], 0.0), minlength=n)
        return count, total


class AggregateTransform:
    kind, version = Aggregate.kind, VERSION

    def fit(self, config: Aggregate, raw: Iterable[Event]) -> list[Event]:
        return list(raw)

    def merge(self, config: Aggregate, partials: Sequence[list[Event]]) -> list[Event]:
        return [event for partial in partials for event in partial]  # in file order: a stable sort keeps it

    def finish(self, config: Aggregate, partial: list[Event], rows: int | None) -> AggregateState:
        unique, key_of = np.unique(np.asarray([event[0] for event in partial], dtype=object), return_inverse=True)
        times = np.fromiter((event[1] for event in partial), dtype=np.float64, count=len(partial))
        order = np.lexsort((times, key_of)).tolist()  # by key, then time; stable: file order among ties
        counts = np.bincount(key_of.reshape(-1), minlength=len(unique)).tolist()
        values = [float(partial[i][3]) for i in order]
        present = [value for value in values if not math.isnan(value)]
        default = math.fsum(present) / len(present) if present and config.aggregate == "mean" else 0.0
        shared = [list(partial[i][2]) for i in order] if config.sharing is not None else None
        vocabulary = sorted({value for values_ in shared for value in values_}) if shared is not None else []
        ordered_times = times[order].tolist() if order else []
        state = AggregateState(unique.tolist(), counts, ordered_times, values, shared, vocabulary, default)
        numeric = numeric_of(config)
        shaping = NumericTransform()
        sums = [shaping.fit(numeric, torch.zeros(0, 1, dtype=torch.float64))]  # the training rows' own aggregates
        for i in range(0, len(partial), _CHUNK):
            sums.append(
                shaping.fit(numeric, torch.from_numpy(state.raw(config, partial[i : i + _CHUNK])).reshape(-1, 1))
            )
        state.numeric = shaping.finish(numeric, shaping.merge(numeric, sums), None)
        return state

    def dump(self, state: AggregateState) -> dict[str, Any]:
        return {
            "keys": state.keys,
            "counts": state.counts,
            "times": state.times_list,
            "values": [None if math.isnan(v) else v for v in state.values_list],
            "sharing": state.shared,
            "vocabulary": state.vocabulary,
            "default": state.default,
            "numeric": state.numeric,
        }

    def load(self, data: dict[str, Any]) -> AggregateState:
        values = [math.nan if v is None else float(v) for v in data["values"]]
        return AggregateState(
            data["keys"],
            data["counts"],
            data["times"],
            values,
            data["sharing"],
            data["vocabulary"],
            data["default"],
            data["numeric"],
        )

    def describe(self, config: Aggregate, state: AggregateState) -> str:
        of = f" of {config.of}" if config.of is not None else ""
        last = f"the last {config.last} " if config.last is not None else ""
        sharing = f" sharing {config.sharing}" if config.sharing is not None else ""
        by = "+".join(config.keys)
        return (
            f"{config.aggregate}{of} over {last}earlier rows by {by}{sharing}: {len(state.keys):,} keys, "
            f"{len(state.times_list):,} training rows, default {state.default:.6g}"
        )

    def apply(
        self, config: Aggregate, state: AggregateState, raw: Sequence[tuple[str, float, Sequence[str]]]
    ) -> torch.Tensor:
        """[n, 1] float32 values of rows (key, time, sharing values)."""
        values = torch.from_numpy(state.raw(config, raw)).reshape(-1, 1)
        assert state.numeric is not None
        return NumericTransform().apply(numeric_of(config), state.numeric, values)
