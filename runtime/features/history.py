"""`history`: a sequence feature built from the earlier rows of the same key in an event table.

`history: {of: movie, by: user, time: ts}` makes, for a row, the `of`
feature's values in the training rows with the same `by` value and a time
strictly earlier than the row's, oldest first, cut to the feature's
`max_length` (its most recent ones). Ties: a training row with the same time
as the row is not in its history, whichever comes first in the file, so two
ratings given in the same second never see each other. The state is the
training rows themselves (per key, their times and values sorted by time,
file order among ties), so:

  training rows   see the training rows of their key before them in time;
  evaluation rows see the training rows of their key before them in time (the
                  training rows count as history; evaluation rows never do);
  predict / a     a request carries its key (`by`) and its time; the history
  server request  is the state's (the training rows), never the request's. An
                  empty time means "now": the key's whole training history.

`where: {column: label, equals: 1}` keeps only the training rows whose
column equals the value (the liked items); the column is read while learning,
from the training rows only, so an evaluation row's or a request's label is
never part of any history (the state is the same kind of rows, filtered: its
format and version do not change).

The values are mapped to ids as the `of` feature maps them (its vocabulary,
or hashing), in the `of` feature's table. A timestamps feature of the
history sequence takes each position's time from the same rows
(`times_before`), so the two never disagree in length or order.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable, Sequence

from runtime.config.transforms import History

VERSION = 1

Event = tuple  # (key, time, value), or with `where` (key, time, value, whether the row enters the history)


class HistoryState:
    """Per key: the training rows' times (sorted) and values."""

    def __init__(self, keys: dict[str, tuple[list[float], list[str]]]) -> None:
        self.keys = keys

    def before(self, key: str, time: float, length: int) -> list[str]:
        """The values of `key` at times < `time`, the last `length` of them, oldest first."""
        found = self.keys.get(key)
        if found is None:
            return []
        end = bisect.bisect_left(found[0], time)
        return found[1][max(0, end - length) : end]

    def times_before(self, rows: Sequence[tuple[str, float]], length: int) -> list[list[float]]:
        """Per row (key, time): the times of `before`'s values, position by position (a timestamps feature
        of the history sequence)."""
        out: list[list[float]] = []
        for key, time in rows:
            found = self.keys.get(key)
            if found is None:
                out.append([])
                continue
            end = bisect.bisect_left(found[0], time)
            out.append(found[0][max(0, end - length) : end])
        return out


class HistoryTransform:
    kind, version = History.kind, VERSION

    def fit(self, config: History, raw: Iterable[Event]) -> dict[str, list[tuple[float, str]]]:
        partial: dict[str, list[tuple[float, str]]] = {}
        for key, time, value, *kept in raw:  # with `where`, a fourth value: whether the row enters
            if config.where is None or kept[0]:
                partial.setdefault(key, []).append((time, value))
        return partial

    def merge(self, config: History, partials: Sequence[dict[str, list[tuple[float, str]]]]) -> dict[str, Any]:
        merged: dict[str, list[tuple[float, str]]] = {}
        for partial in partials:  # in file order: a stable sort keeps it among ties
            for key, events in partial.items():
                merged.setdefault(key, []).extend(events)
        return merged

    def finish(self, config: History, partial: dict[str, list[tuple[float, str]]], rows: int | None) -> HistoryState:
        keys = {}
        for key in sorted(partial):
            events = sorted(partial[key], key=lambda event: event[0])
            keys[key] = ([time for time, _ in events], [value for _, value in events])
        return HistoryState(keys)

    def dump(self, state: HistoryState) -> dict[str, Any]:
        return {"keys": {key: [times, values] for key, (times, values) in state.keys.items()}}

    def load(self, data: dict[str, Any]) -> HistoryState:
        return HistoryState({key: (times, values) for key, (times, values) in data["keys"].items()})

    def describe(self, config: History, state: HistoryState) -> str:
        events = sum(len(times) for times, _ in state.keys.values())
        return f"history of {config.of} by {config.by}: {len(state.keys):,} keys, {events:,} training rows"

    def apply(
        self, config: History, state: HistoryState, raw: Sequence[tuple[str, float]], length: int
    ) -> list[list[str]]:
        """Per row (key, time): the values of its history."""
        return [state.before(key, time, length) for key, time in raw]
