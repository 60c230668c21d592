"""MovieLens ratings as training rows: ml-100k, ml-1m, ml-10m and ml-latest.

The layouts, told apart by the ratings file's first line:

    tab  ml-100k  u.data       user id \\t item id \\t rating \\t timestamp
    dat  ml-1m    ratings.dat  UserID::MovieID::Rating::Timestamp   (also ml-10m)
    csv  latest   ratings.csv  userId,movieId,rating,timestamp      (after a header line)

PATH is the ratings file or the directory holding it. The columns are
named as in ml-latest's header: `userId`, `movieId`, `rating`,
`timestamp`, plus `genres` from the movies file. By default `userId` feeds
the sparse feature `user_id`, `movieId` feeds `movie_id`, `genres` feeds
`genres` (a multi-hot bag, weight 1 per genre) and `rating` feeds the first
head's label: for a bce head 1 when the rating reaches the threshold (4 by
default), for an mse head the rating itself. A retrieval head (loss
`sampled_softmax`) reads no label: its positives are the ids of its item
feature (`movie_id`, or the `history` sequence of a next-item model), so the
data is positives only: a rating below the threshold is no row at all, and
is in no history either (runtime.data.movielens.split splits such data by
time per user). `history` (the user's movieIds
rated before this rating, oldest first; runtime.data.movielens.history says
exactly which) feeds the sequence feature `history`, cut to its
`max_length` as it is read, and every timestamps feature of that sequence
gets the history's timestamps. `data.columns` overrides any of it. Ids map to table rows through a `Vocabulary` (`runtime.data.movielens.vocab`);
an id outside it goes to row 0 and is counted (`unseen_features`, runtime.data.checks.unseen_ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import torch

from runtime.config.data import ModelInputs, SparseFeatureConfig
from runtime.data.columns import USER_IDS, Columns, Jagged
from runtime.data.errors import DataError, RowError
from runtime.data.files.text_lines import first_line, numbered_lines
from runtime.data.movielens.history import HistoryIndex
from runtime.data.movielens.vocab import MOVIES_FILES, Vocabulary
from runtime.data.spec_columns import (
    check_labels_fed,
    explicit_columns,
    feature_list,
    is_weighted,
    table_rows,
)

COLUMNS = ("userId", "movieId", "rating", "timestamp", "genres", "history")
RATINGS_FILES = ("u.data", "ratings.dat", "ratings.csv")
DEFAULT_FEATURES = {"userId": "user_id", "movieId": "movie_id", "genres": "genres", "history": "history"}
DEFAULT_THRESHOLD = 4.0
_SEPARATORS = {"tab": b"\t", "dat": b"::", "csv": b","}
_FIELDS = ("userId", "movieId", "rating", "timestamp")
CSV_HEADER = b"userId,movieId,"  # how ml-latest's ratings.csv begins

# One parsed line: user id, movie id, rating, timestamp.
RatingRow = tuple[int, int, float, int]


@dataclass(frozen=True, slots=True)
class MovieLensLayout:
    """Which features the id columns feed (None: unused) and how ratings become labels."""

    user: str | None
    movie: str | None
    genres: str | None
    labels: tuple[tuple[str, str], ...]  # (head label, "bce" | "mse")
    history: str | None = None  # a sequence feature
    max_length: int = 0  # the history feature's
    keep: str = "end"
    timestamps: tuple[str, ...] = ()  # the timestamps features of the history feature
    keys: tuple[str, ...] = ()  # the batch's sparse keys: sparse features, then timestamps features
    positives_only: bool = False  # a retrieval head: ratings below the threshold are no rows
    next_item: bool = False  # a retrieval head's positives are the history sequence's ids
    user_ids: bool = False  # a retrieval head reports per-user metrics: the labels carry USER_IDS
    max_genres: int | None = None  # the genres feature's max_ids_per_sample: a movie with more is a bad row


class MovieLensReader:
    """One MovieLens ratings file for one spec; ids map to rows through `vocabulary`.

    `earlier`: the training ratings file when this one is read for evaluation;
    its ratings count as history for this file's (runtime.data.movielens.history).
    `held_out`: the rows are evaluated (not requests to answer): a next-item
    model's sequence is then the row's history followed by the row's own movie
    (the history cut to max_length - 1 to make room), so the model's query at
    the last history position is ranked on the held-out movie, never on a
    movie of the history (runtime.retrieval.head.RetrievalOutput.held_out).
    """

    name = "movielens"

    def __init__(
        self,
        inputs: ModelInputs,
        path: str | Path,
        vocabulary: Vocabulary,
        threshold: float = DEFAULT_THRESHOLD,
        earlier: Path | None = None,
        held_out: bool = False,
    ) -> None:
        self.file, self.format = ratings_file(path)
        self.source = str(path)
        self.layout = movielens_layout(inputs)
        self.vocabulary = vocabulary
        self.threshold = threshold
        self.weighted = is_weighted(inputs)
        # Positives only (a retrieval head): lines below the threshold are no rows. `reccompile
        # retrieve` turns it off: every line of a requests file is a request.
        self.positives_only = self.layout.positives_only
        self.unseen_features = tuple(f for f in (self.layout.user, self.layout.movie) if f is not None)
        self._separator = _SEPARATORS[self.format]
        self.timestamps = inputs.timestamps
        check_rows(inputs, self.layout, vocabulary)
        self.held_out = held_out and self.layout.next_item
        self.histories: HistoryIndex | None = None
        if self.layout.history is not None:
            files = [self.file] if earlier is None or _same_file(earlier, self.file) else [earlier, self.file]
            floor = threshold if self.layout.positives_only else float("-inf")
            events = ((u, m, t) for f in files for u, m, s, t in good_ratings(f, ratings_file(f)[1]) if s >= floor)
            self.histories = HistoryIndex.build(events, vocabulary.movies)

    def epoch_lines(self) -> Iterator[tuple[str, int, bytes]]:
        name = str(self.file)
        for number, line in numbered_lines(self.file, skip=1 if self.format == "csv" else 0):
            if self.positives_only and not self._positive(line):
                continue
            yield name, number, line

    def _positive(self, line: bytes) -> bool:
        """Whether a line is a positive; a bad line counts as one, so `parse` reports it."""
        try:
            return self.parse(line)[2] >= self.threshold
        except RowError:
            return True

    def parse(self, line: bytes) -> RatingRow:
        """User id, movie id, rating and timestamp of one line; RowError names the bad column."""
        row = parse_rating(line, self._separator)
        limit, genres = self.layout.max_genres, self.vocabulary.movie_genres.get(row[1], ())
        if limit is not None and len(genres) > limit:
            names = "|".join(self.vocabulary.genres[g] for g in genres)
            reason = (
                f"movie {row[1]} has {len(genres)} genres, but feature {self.layout.genres!r} takes at most "
                f"{limit} (max_ids_per_sample)"
            )
            raise RowError("genres", names, reason)
        return row

    def to_columns(self, rows: list[RatingRow]) -> Columns:
        vocab, layout = self.vocabulary, self.layout
        sparse: dict[str, Jagged] = {}
        if layout.user is not None:
            sparse[layout.user] = Jagged.one_per_row(torch.tensor([vocab.user_row(r[0]) for r in rows]))
        if layout.movie is not None:
            sparse[layout.movie] = Jagged.one_per_row(torch.tensor([vocab.movie_row(r[1]) for r in rows]))
        if layout.genres is not None:
            bags = [vocab.movie_genres.get(r[1], ()) for r in rows]
            ids = [g for bag in bags for g in bag]
            lengths = torch.tensor([len(bag) for bag in bags], dtype=torch.long)
            sparse[layout.genres] = Jagged(lengths, torch.tensor(ids, dtype=torch.long), None)
        stars = torch.tensor([r[2] for r in rows], dtype=torch.float32)
        labels = {label: (stars >= self.threshold).float() if loss == "bce" else stars for label, loss in layout.labels}
        if layout.user_ids:
            labels[USER_IDS] = torch.tensor([r[0] for r in rows], dtype=torch.long)
        if layout.history is not None and self.histories is not None:
            users = torch.tensor([r[0] for r in rows], dtype=torch.long)
            stamps = torch.tensor([r[3] for r in rows], dtype=torch.long)
            room = layout.max_length - 1 if self.held_out else layout.max_length
            lengths, movies, times = self.histories.cut(users, stamps, room, layout.keep)
            if self.held_out:
                own = torch.tensor([vocab.movie_row(r[1]) for r in rows], dtype=torch.long)
                lengths, movies, times = _followed_by(lengths, movies, times, own, stamps)
            sparse[layout.history] = Jagged(lengths, movies, None)
            for name in layout.timestamps:
                sparse[name] = Jagged(lengths, times, None)
        return Columns({}, {key: sparse[key] for key in layout.keys}, labels)


_INT64_MAX = 2**63 - 1


def _followed_by(
    lengths: torch.Tensor, movies: torch.Tensor, times: torch.Tensor, own: torch.Tensor, stamps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's history (lengths, movies, times) with the row's own movie and time after it."""
    longer = lengths + 1
    last = torch.cumsum(longer, 0) - 1
    is_last = torch.zeros(int(longer.sum()), dtype=torch.bool)
    is_last[last] = True
    joined_movies = torch.empty(is_last.numel(), dtype=torch.long)
    joined_times = torch.empty(is_last.numel(), dtype=torch.long)
    joined_movies[last], joined_movies[~is_last] = own, movies
    joined_times[last], joined_times[~is_last] = stamps, times
    return longer, joined_movies, joined_times


def parse_rating(line: bytes, separator: bytes) -> RatingRow:
    """User id, movie id, rating and timestamp of one ratings line; RowError names the bad column."""
    fields = line.split(separator)
    if len(fields) != len(_FIELDS):
        sep = separator.decode()
        raise RowError(None, line, f"{len(fields)} {sep!r}-separated fields, expected 4 ({', '.join(_FIELDS)})")
    user, movie, rating, stamp = fields
    for column, value in (("userId", user), ("movieId", movie), ("timestamp", stamp)):
        if not value.isdigit():
            raise RowError(column, value, "not a non-negative integer")
        if len(value) > 18 and int(value) > _INT64_MAX:  # an id or time tensor holds int64
            raise RowError(column, value, "past the 64-bit integers")
    try:
        stars = float(rating)
    except ValueError:
        raise RowError("rating", rating, "not a number") from None
    if not 0.0 < stars <= 5.0:
        raise RowError("rating", rating, "outside the MovieLens range (0, 5]")
    return int(user), int(movie), stars, int(stamp)


def good_ratings(file: Path, layout: str) -> Iterator[RatingRow]:
    """Every good line of a ratings file, parsed, in file order.

    Bad lines are passed over here; the training pass reports them.
    """
    for _, line in numbered_lines(file, skip=1 if layout == "csv" else 0):
        try:
            yield parse_rating(line, _SEPARATORS[layout])
        except RowError:
            continue


def rating_ids(file: Path, layout: str) -> Iterator[tuple[int, int]]:
    """(user id, movie id) of every good line of a ratings file: the vocabulary's one pass."""
    for user, movie, _, _ in good_ratings(file, layout):
        yield user, movie


def _same_file(one: Path, other: Path) -> bool:
    return one.resolve() == other.resolve()


def ratings_file(path: str | Path) -> tuple[Path, str]:
    """The ratings file of `path` (a file, or a directory holding one) and its layout."""
    file = Path(path)
    if file.is_dir():
        found = [file / name for name in RATINGS_FILES if (file / name).is_file()]
        if not found:
            raise DataError(f"{path}: no MovieLens ratings file here (looked for {', '.join(RATINGS_FILES)})")
        file = found[0]
    elif not file.exists():
        raise DataError(f"{path}: no such file or directory")
    line = first_line(file)
    if line is None:
        raise DataError(f"{file}: the ratings file is empty")
    shown = line[:60].decode("utf-8", "replace")
    for layout, separator in (("dat", b"::"), ("tab", b"\t"), ("csv", b",")):
        if separator in line:
            if layout == "csv" and not line.removeprefix(b"\xef\xbb\xbf").startswith(CSV_HEADER):
                # every reader of the layout skips line 1: a file without the header would lose a rating
                raise DataError(
                    f"{file}:1: a comma-separated ratings file (ml-latest's ratings.csv) starts with the header "
                    f"{CSV_HEADER.decode()}..., not {shown!r}"
                )
            return file, layout
    raise DataError(f"{file}:1: not a MovieLens ratings line (tab-, '::'- or comma-separated): {shown!r}")


def movies_file(ratings: Path, layout: str) -> Path:
    """Where the movies file of a ratings file is: beside it, named for the layout."""
    return ratings.with_name(MOVIES_FILES[layout])


def movielens_layout(inputs: ModelInputs) -> MovieLensLayout:
    """The mapping of MovieLens columns onto `inputs`'s features and labels; DataError when it cannot fit."""
    explicit = explicit_columns(inputs, "movielens", COLUMNS)
    sparse = [f.name for f in inputs.sparse]
    if inputs.dense:
        names = [f.name for f in inputs.dense]
        raise DataError(f"movielens has no dense columns to feed dense features {feature_list(names)}")
    if "timestamp" in explicit:
        raise DataError("data.columns.timestamp: the timestamp column cannot feed a feature or label")
    feeds: dict[str, str | None] = {}
    for column, default in DEFAULT_FEATURES.items():
        target = explicit.get(column, default if default in sparse and default not in explicit.values() else None)
        if target is not None and target not in sparse:
            raise DataError(f"data.columns.{column}: the {column} column feeds a sparse feature, not {target!r}")
        feeds[column] = target
    missing = [name for name in sparse if name not in feeds.values()]
    if missing:
        raise DataError(
            f"sparse features {feature_list(missing)} have no movielens column "
            f"(the columns userId, movieId, genres and history feed user_id, movie_id, genres and "
            f"history by default)"
        )
    history = _history_feature(inputs, feeds["history"])
    genres = next((f for f in inputs.sparse if f.name == feeds["genres"]), None)
    common = dict(
        max_genres=None if genres is None or genres.fixed_ids else genres.ids_per_sample,
        history=feeds["history"],
        max_length=0 if history is None else history.max_length or 0,
        keep="end" if history is None else history.keep,
        timestamps=tuple(t.name for t in inputs.timestamps),
        keys=(*sparse, *(t.name for t in inputs.timestamps)),
    )
    if any(head.loss == "sampled_softmax" for head in inputs.heads):
        _check_retrieval_heads(inputs, explicit, feeds)
        next_item = any(head.label == feeds["history"] for head in inputs.heads if feeds["history"] is not None)
        user_ids = any(name.startswith("user_") for head in inputs.heads for name in head.metrics)
        return MovieLensLayout(
            feeds["userId"],
            feeds["movieId"],
            feeds["genres"],
            (),
            positives_only=True,
            next_item=next_item,
            user_ids=user_ids,
            **common,
        )
    label = explicit.get("rating", inputs.heads[0].label)
    heads = [head for head in inputs.heads if head.label == label]
    if not heads:
        raise DataError(f"data.columns.rating: the rating column feeds a head label, not {label!r}")
    if heads[0].loss not in ("bce", "mse"):
        raise DataError(
            f"head {heads[0].name!r} has a {heads[0].loss} loss: movielens ratings feed bce heads "
            f"(rating >= threshold) or mse heads (the rating)"
        )
    check_labels_fed(inputs, "movielens", {label})
    return MovieLensLayout(feeds["userId"], feeds["movieId"], feeds["genres"], ((label, heads[0].loss),), **common)


def _check_retrieval_heads(inputs: ModelInputs, explicit: Mapping[str, str], feeds: Mapping[str, str | None]) -> None:
    """Positives-only data feeds retrieval heads alone, each taking its positives from movieId or history."""
    others = [head.name for head in inputs.heads if head.loss != "sampled_softmax"]
    if others:
        raise DataError(
            f"heads {feature_list(others)} need labels, but a sampled_softmax head makes movielens data "
            f"positives only (ratings >= the threshold): train them in another spec"
        )
    if "rating" in explicit:
        raise DataError(
            "data.columns.rating: a sampled_softmax head reads no label (its positives are its item "
            "feature's ids), so the rating column feeds nothing: remove it"
        )
    movie_features = {feeds["movieId"], feeds["history"]} - {None}
    for head in inputs.heads:
        if head.label not in movie_features:
            raise DataError(
                f"{head.describe()}: its positives are the ids of feature {head.label!r}, which no movielens "
                f"movie column feeds (movieId feeds {feeds['movieId']!r}, history feeds {feeds['history']!r})"
            )


def _history_feature(inputs: ModelInputs, name: str | None) -> SparseFeatureConfig | None:
    """The sequence feature the history column feeds; every timestamps feature must belong to it."""
    feature = next((f for f in inputs.sparse if f.name == name), None)
    if feature is not None and feature.max_length is None:
        raise DataError(
            f"feature {name!r}: the history column feeds a sequence feature (pooling: none with a "
            f"max_length), but {name!r} is pooled"
        )
    for stamps in inputs.timestamps:
        if stamps.sequence != name:
            raise DataError(
                f"timestamps feature {stamps.name!r} belongs to sequence {stamps.sequence!r}, which the "
                f"history column does not feed: movielens has timestamps for the history only"
            )
    return feature


def check_rows(inputs: ModelInputs, layout: MovieLensLayout, vocabulary: Vocabulary) -> None:
    """The vocabulary must fit the tables: ids need one row each plus row 0 for unseen ids."""
    rows = table_rows(inputs)
    needs: Mapping[str | None, tuple[int, str]] = {
        layout.user: (len(vocabulary.users) + 1, "userId values plus row 0 for unseen ids"),
        layout.movie: (len(vocabulary.movies) + 1, "movieId values plus row 0 for unseen ids"),
        layout.genres: (len(vocabulary.genres), "genres"),
        layout.history: (len(vocabulary.movies) + 1, "movieId values plus row 0 for unseen ids"),
    }
    for feature, (needed, what) in needs.items():
        if feature is not None and needed > rows[feature]:
            raise DataError(f"feature {feature!r}: {needed} rows needed ({what}) but its table has {rows[feature]}")
