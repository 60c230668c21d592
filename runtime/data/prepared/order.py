"""The order of an epoch: which row of which row group each position 0..rows-1 of an epoch is.

Prepared order: position i is the i-th row of the prepared data, so a run
of positions is a run of rows of one or two row groups. Shuffled (a seed
and a window of K row groups): each epoch deals the row groups in a seeded
random order, cuts that sequence into windows of K groups, and deals the
rows of each window in a seeded random order; epoch e's shuffle depends on
(seed, e) only, so every rank, worker and world size computes the same one.
A run of positions then falls in one window (or two), whose row groups
must be decoded to take it: a larger window mixes more, and a rank decodes
more per row it trains.

>>> order = EpochOrder([4, 4, 2], seed=None, window=0)
>>> order.select(0, 3, 9)
Selection(groups=(0, 1, 2), ranges=((3, 4), (0, 4), (0, 1)), take=None)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Selection:
    """Rows to read, in order: `ranges[i]` of `groups[i]` one after the other, or else the
    rows `take` of the row groups `groups` decoded and joined in that order."""

    groups: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...] | None
    take: np.ndarray | None


class EpochOrder:
    """Positions of an epoch to rows of row groups (of `group_rows` rows each, in prepared order)."""

    def __init__(self, group_rows: Sequence[int], *, seed: int | None, window: int) -> None:
        if seed is not None and window < 1:
            raise ValueError(f"a shuffle needs a window of at least 1 row group, got {window}")
        self.group_rows = np.asarray(group_rows, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.group_rows)])
        self.rows = int(self.starts[-1])
        self.seed, self.window = seed, window
        self._windows = lru_cache(maxsize=2)(self._epoch_windows)
        self._shuffles = lru_cache(maxsize=4)(self._window_shuffle)

    def select(self, epoch: int, lo: int, hi: int) -> Selection:
        """The rows of positions lo..hi-1 of `epoch` (0 <= lo <= hi <= rows)."""
        if self.seed is None:
            return self._prepared(lo, hi)
        groups, window_starts = self._windows(epoch)
        picked_groups: list[int] = []
        take: list[np.ndarray] = []
        first = int(np.searchsorted(window_starts, lo, side="right")) - 1
        for w in range(first, len(window_starts) - 1):
            a, b = max(lo, int(window_starts[w])), min(hi, int(window_starts[w + 1]))
            if a >= b:
                break
            members = groups[w * self.window : (w + 1) * self.window]
            member_starts = np.concatenate([[0], np.cumsum(self.group_rows[members])])
            within = self._shuffles(epoch, w)[a - int(window_starts[w]) : b - int(window_starts[w])]
            slot = np.searchsorted(member_starts, within, side="right") - 1
            used = np.unique(slot)
            local = within - member_starts[slot]
            # rows of the used groups only, joined in window order: where each used group begins
            joined = np.concatenate([[0], np.cumsum(self.group_rows[members[used]])])[:-1]
            base = int(self.group_rows[picked_groups].sum()) if picked_groups else 0
            take.append(base + joined[np.searchsorted(used, slot)] + local)
            picked_groups.extend(int(g) for g in members[used])
        indices = np.concatenate(take) if take else np.zeros(0, dtype=np.int64)
        return Selection(tuple(picked_groups), None, indices)

    def _prepared(self, lo: int, hi: int) -> Selection:
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        groups, ranges = [], []
        g = first
        while lo < hi:
            end = min(hi, int(self.starts[g + 1]))
            groups.append(g)
            ranges.append((lo - int(self.starts[g]), end - int(self.starts[g])))
            lo, g = end, g + 1
        return Selection(tuple(groups), tuple(ranges), None)

    def _epoch_windows(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The row groups in this epoch's order, and where each window's positions start."""
        groups = np.random.default_rng([self.seed, epoch]).permutation(len(self.group_rows))
        sizes = [int(self.group_rows[groups[i : i + self.window]].sum()) for i in range(0, len(groups), self.window)]
        return groups, np.concatenate([[0], np.cumsum(sizes)])

    def _window_shuffle(self, epoch: int, window: int) -> np.ndarray:
        groups, starts = self._windows(epoch)
        rows = int(starts[window + 1] - starts[window])
        return np.random.default_rng([self.seed, epoch, window]).permutation(rows)
