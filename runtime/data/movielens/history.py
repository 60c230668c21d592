"""MovieLens histories: for each rating, the same user's earlier movies and their times.

A rating's history is the movies the same user rated at a strictly earlier
timestamp, oldest first; ratings at the same second as it (or later) are
never part of it. Among earlier ratings of equal timestamps the order is the
order of the lines in the files (the training file's before the evaluation
file's). Bad lines (the ones the reader reports or skips) are in no history.

Which ratings a history may hold: a training file's rows take theirs from
the training file alone, so training never sees an evaluation rating, not
even as a history id. An evaluation file's rows take theirs from the
evaluation file and the training file together: a user's past in training
is history for their later evaluation ratings (the leave-last-out split of
SASRec and BERT4Rec), and a training rating later than the evaluation
rating is never in it, so evaluation never sees the future.

`HistoryIndex` holds every rating of those files once, sorted by (user,
time, line order), as three int64 columns; `cut` finds each row's earlier
ratings with binary searches and copies out at most `max_length` of them
(the most recent with keep "end", the oldest with keep "start"), so no
history longer than the model reads is ever built.

>>> index = HistoryIndex.build([(7, 10, 100), (7, 11, 90), (7, 12, 100), (8, 10, 50)], {10: 1, 11: 2, 12: 3})
>>> lengths, movies, times = index.cut(torch.tensor([7, 7]), torch.tensor([100, 101]), max_length=2, keep="end")
>>> lengths.tolist(), movies.tolist(), times.tolist()
([1, 2], [2, 1, 3], [90, 100, 100])
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch


class HistoryIndex:
    """Ratings sorted by (user, time, line order): where each rating's history is cut from."""

    def __init__(
        self, users: torch.Tensor, stamps: torch.Tensor, keys: torch.Tensor, movies: torch.Tensor, times: torch.Tensor
    ) -> None:
        self._users = users  # the distinct user ids, sorted
        self._stamps = stamps  # the distinct timestamps, sorted
        self._keys = keys  # user's index * (len(stamps) + 1) + timestamp's index, sorted
        self._movies = movies  # table rows, in key order
        self._times = times

    @staticmethod
    def build(ratings: Iterable[tuple[int, int, int]], movie_rows: Mapping[int, int]) -> HistoryIndex:
        """The index of (user id, movie id, timestamp) ratings in line order; movies map to
        table rows through `movie_rows` (0 for a movie it lacks)."""
        users_seen: list[int] = []
        movies: list[int] = []
        times: list[int] = []
        for user, movie, stamp in ratings:
            users_seen.append(user)
            movies.append(movie_rows.get(movie, 0))
            times.append(stamp)
        user_ids = torch.tensor(users_seen, dtype=torch.long)
        time_values = torch.tensor(times, dtype=torch.long)
        users, user_index = torch.unique(user_ids, sorted=True, return_inverse=True)
        stamps, stamp_index = torch.unique(time_values, sorted=True, return_inverse=True)
        keys = user_index * (stamps.numel() + 1) + stamp_index
        keys, order = torch.sort(keys, stable=True)  # stable: equal keys stay in line order
        return HistoryIndex(users, stamps, keys, torch.tensor(movies, dtype=torch.long)[order], time_values[order])

    def __len__(self) -> int:
        return self._keys.numel()

    def cut(
        self, users: torch.Tensor, stamps: torch.Tensor, max_length: int, keep: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The histories of ratings (user ids, timestamps): lengths, movie rows and their times.

        At most `max_length` per rating: the most recent when `keep` is "end", the oldest when "start".
        A user the index lacks has an empty history.
        """
        if keep not in ("end", "start"):
            raise ValueError(f"keep must be 'end' or 'start', got {keep!r}")
        span = self._stamps.numel() + 1
        where = torch.searchsorted(self._users, users).clamp(max=max(self._users.numel() - 1, 0))
        known = self._users[where] == users if self._users.numel() else torch.zeros_like(users, dtype=torch.bool)
        first_key = where * span
        before_key = first_key + torch.searchsorted(self._stamps, stamps)  # stamps strictly earlier
        first = torch.searchsorted(self._keys, first_key)
        end = torch.where(known, torch.searchsorted(self._keys, before_key), first)
        if keep == "end":
            lo, hi = torch.maximum(first, end - max_length), end
        else:
            lo, hi = first, torch.minimum(end, first + max_length)
        lengths = hi - lo
        starts = torch.cumsum(lengths, 0) - lengths
        picked = torch.arange(int(lengths.sum())) + torch.repeat_interleave(lo - starts, lengths)
        return lengths, self._movies[picked], self._times[picked]
