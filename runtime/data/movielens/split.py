"""MovieLens positives split by time per user: the training file and the held-out file.

For retrieval models (a `sampled_softmax` head) a rating at or above the
threshold is a positive and every other rating is dropped. Each user's
positives are ordered by (timestamp, line number) and the last
`ceil(holdout * n)` of them are held out, at most n - 1 so every user keeps
one positive to train on (a user with a single positive is held out from
nothing). The two parts are written as ratings files of the input's own
layout and name (its lines verbatim, in file order, the csv header kept),
with the movies file copied beside each, so the MovieLens reader reads them
as any other file: the training run builds its vocabulary from the training
part, and a held-out movie that no training line has goes to row 0 and is
counted there (runtime.data.checks.unseen_ids), never scored as another movie.

    DIR/train/ratings.dat    the earlier positives of every user
    DIR/test/ratings.dat     the later ones: --eval-data, and the export's recall check

Nothing is written when DIR/train or DIR/test exists already: it may hold
an earlier split, whose parts would be replaced, or the input itself,
which writing the training part would overwrite with its positives.

>>> split = split_by_time("ml-1m/ratings.dat", "split", holdout=0.2)   # doctest: +SKIP
>>> split.describe()                                                    # doctest: +SKIP
'6,040 users, 575,281 positives (424,928 below the threshold dropped): 458,975 train (split/train/...'
"""

from __future__ import annotations

import math
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from runtime.data.errors import DataError, RowError
from runtime.data.files.text_lines import numbered_lines
from runtime.data.movielens.reader import DEFAULT_THRESHOLD, movies_file, parse_rating, ratings_file

__all__ = ["MovieLensSplit", "refuse_outdir", "split_by_time"]

_SEPARATORS = {"tab": b"\t", "dat": b"::", "csv": b","}


@dataclass(frozen=True, slots=True)
class MovieLensSplit:
    """What `split_by_time` wrote, and the counts it prints."""

    train: Path
    test: Path
    users: int
    positives: int
    dropped: int  # ratings below the threshold
    train_rows: int
    test_rows: int
    test_users: int  # users with at least one held-out positive
    unseen_movies: int  # held-out positives whose movie no training line has

    def describe(self) -> str:
        return (
            f"{self.users:,} users, {self.positives:,} positives ({self.dropped:,} below the threshold dropped): "
            f"{self.train_rows:,} train ({self.train}), {self.test_rows:,} held out of {self.test_users:,} users "
            f"({self.test}); held-out positives of movies training never sees: {self.unseen_movies:,}"
        )


def split_by_time(
    path: str | Path, outdir: str | Path, *, threshold: float = DEFAULT_THRESHOLD, holdout: float = 0.2
) -> MovieLensSplit:
    """Split the positives of the ratings at `path` into `outdir`/train and `outdir`/test (see the module)."""
    if not 0.0 < holdout < 1.0:
        raise DataError(f"holdout must be between 0 and 1 (exclusive), got {holdout:g}")
    file, layout = ratings_file(path)
    root = Path(outdir)
    refuse_outdir(root, [file, movies_file(file, layout)])
    header, positives, dropped = _read_positives(file, layout, threshold)
    held: set[int] = set()
    for events in positives.values():
        events.sort()
        count = min(len(events) - 1, math.ceil(holdout * len(events)))
        held.update(number for _, number, _, _ in events[len(events) - count :] if count > 0)
    rows = sorted((number, movie, line) for events in positives.values() for _, number, movie, line in events)
    train_movies = {movie for number, movie, _ in rows if number not in held}
    train = _write(root / "train" / file.name, header, [line for number, _, line in rows if number not in held])
    test = _write(root / "test" / file.name, header, [line for number, _, line in rows if number in held])
    movies = movies_file(file, layout)
    if movies.is_file():
        for part in (train, test):
            shutil.copyfile(movies, part.with_name(movies.name))
    test_users = sum(1 for events in positives.values() if any(e[1] in held for e in events))
    return MovieLensSplit(
        train,
        test,
        len(positives),
        len(rows),
        dropped,
        len(rows) - len(held),
        len(held),
        test_users,
        sum(1 for number, movie, _ in rows if number in held and movie not in train_movies),
    )


def refuse_outdir(root: Path, inputs: list[Path]) -> None:
    """DataError when writing the split into `root` could replace anything: its train/ or test/ exists."""
    if root.exists() and not root.is_dir():
        raise DataError(f"{root}: exists and is not a directory; choose another -o")
    for part in ("train", "test"):
        folder = root / part
        if not os.path.lexists(folder):
            continue
        inside = [file for file in inputs if file.exists() and file.resolve().is_relative_to(folder.resolve())]
        if inside:
            raise DataError(
                f"{inside[0]}: an input of this split, in {folder}, which the split writes; choose another -o"
            )
        raise DataError(f"{folder}: already exists (an earlier split?); choose another -o, or remove it to split again")


_Event = tuple[int, int, int, bytes]  # timestamp, line number, movie id, the line


def _read_positives(file: Path, layout: str, threshold: float) -> tuple[bytes | None, dict[int, list[_Event]], int]:
    """The header line (csv), every user's positives, and how many ratings were below the threshold.

    A bad line stops the split with its file, line and column: held-out data with a line
    silently missing would measure recall on other users than it says."""
    header: bytes | None = None
    positives: dict[int, list[_Event]] = defaultdict(list)
    dropped = 0
    lines = numbered_lines(file)
    if layout == "csv":
        header = next(lines)[1]
    for number, line in lines:
        if not line.strip():
            continue
        try:
            user, movie, stars, stamp = parse_rating(line, _SEPARATORS[layout])
        except RowError as error:
            column = f"column {error.column} ({error.value!r}): " if error.column else ""
            raise DataError(f"{file}:{number}: {column}{error.reason}") from None
        if stars >= threshold:
            positives[user].append((stamp, number, movie, line))
        else:
            dropped += 1
    if not positives:
        raise DataError(f"{file}: no rating reaches the threshold {threshold:g}: there are no positives to split")
    return header, positives, dropped


def _write(path: Path, header: bytes | None, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = b"".join(line + b"\n" for line in ([header] if header is not None else []) + lines)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(body)
    temporary.replace(path)
    return path
