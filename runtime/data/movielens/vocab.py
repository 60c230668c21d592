"""MovieLens vocabularies: user and movie ids to table rows, genres to rows.

Built in one pass over the ratings file: the distinct user ids and movie ids,
sorted, so the same file gives the same rows on every rank and machine
whatever its line order. Row 0 of the user and movie tables is kept for ids
the vocabulary has not seen (an evaluation split's new users); id k of the
sorted list takes row k + 1. Genres come from the movies file beside the
ratings (`u.item`, `movies.dat` or `movies.csv`), rows in sorted name order
(ml-100k's fixed genre list in its own order).

The vocabulary is saved as JSON beside the generated module and reused while
the ratings file is unchanged (same path, size and mtime); when the spec
reads genres it holds them too, the names in row order and every movie's
genre rows. Every checkpoint carries a copy (VOCABULARY_FILE), and so does
an export of it: prediction maps ids and genres with the vocabulary training
used, never one built from the file it scores. (A vocabulary saved before
genres were kept takes them from the movies file beside the scored ratings.)
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from runtime.data.errors import DataError
from runtime.data.files.text_lines import numbered_lines

VOCAB_FORMAT = 1
# The vocabulary's name inside a checkpoint and an export directory.
VOCABULARY_FILE = "vocab.json"
# ml-100k's u.item flags, in file order (from its README / u.genre).
ML100K_GENRES = (
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
MOVIES_FILES = {"tab": "u.item", "dat": "movies.dat", "csv": "movies.csv"}


@dataclass(frozen=True)
class Vocabulary:
    """Row numbers of user ids, movie ids and genre names, and each movie's genre rows."""

    users: dict[int, int]
    movies: dict[int, int]
    genres: tuple[str, ...] = ()
    movie_genres: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def user_row(self, user: int) -> int:
        return self.users.get(user, 0)

    def movie_row(self, movie: int) -> int:
        return self.movies.get(movie, 0)


def build_vocabulary(ids: Iterator[tuple[int, int]]) -> Vocabulary:
    """The user and movie vocabularies of (user id, movie id) pairs, in one pass."""
    users: set[int] = set()
    movies: set[int] = set()
    for user, movie in ids:
        users.add(user)
        movies.add(movie)
    return Vocabulary(_rows(users), _rows(movies))


def load_or_build(
    ratings: Path, saved: Path | None, build: Callable[[], Vocabulary], save: bool, genres: bool = False
) -> Vocabulary:
    """The saved vocabulary of `ratings` when still current (and holding genres, when `genres`),
    else `build()` (saved when `save`)."""
    signature = _signature(ratings)
    if saved is not None and saved.is_file():
        document = json.loads(saved.read_text())
        current = document.get("format") == VOCAB_FORMAT and document.get("source") == signature
        if current and (not genres or "genres" in document):
            return _from_document(document)
    vocabulary = build()
    if saved is not None and save:
        save_vocabulary(vocabulary, saved, ratings)
    return vocabulary


def save_vocabulary(vocabulary: Vocabulary, saved: Path, ratings: Path) -> None:
    """Write `vocabulary`, built from the ratings file `ratings`, to `saved` (whole or not at all)."""
    document: dict[str, Any] = {
        "format": VOCAB_FORMAT,
        "source": _signature(ratings),
        "userId": sorted(vocabulary.users),
        "movieId": sorted(vocabulary.movies),
    }
    if vocabulary.genres:  # the genre rows travel with the ids: scoring must not renumber them
        document["genres"] = list(vocabulary.genres)
        document["movieGenres"] = {str(movie): list(rows) for movie, rows in sorted(vocabulary.movie_genres.items())}
    temporary = saved.with_name(f".{saved.name}.{os.getpid()}.tmp")
    saved.parent.mkdir(parents=True, exist_ok=True)
    temporary.write_text(json.dumps(document))
    temporary.replace(saved)  # atomic: a reader never sees half a file


def read_vocabulary(path: Path) -> Vocabulary:
    """The vocabulary saved at `path`, whatever file it was built from (a checkpoint's, an export's)."""
    try:
        document = json.loads(path.read_text())
        if document.get("format") != VOCAB_FORMAT:
            raise ValueError(f"format {document.get('format')!r}, expected {VOCAB_FORMAT}")
        return _from_document(document)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise DataError(f"{path}: not a readable MovieLens vocabulary ({error})") from None


def _from_document(document: dict[str, Any]) -> Vocabulary:
    genres = tuple(document.get("genres", ()))
    movie_genres = {int(movie): tuple(rows) for movie, rows in document.get("movieGenres", {}).items()}
    if any(not 0 <= row < len(genres) for rows in movie_genres.values() for row in rows):
        raise ValueError("a movie's genre row is outside its genres")
    return Vocabulary(_rows(document["userId"]), _rows(document["movieId"]), genres, movie_genres)


def with_genres(vocabulary: Vocabulary, movies_file: Path, layout: str) -> Vocabulary:
    """`vocabulary` plus the genres of every movie in `movies_file` (`layout`: tab, dat or csv)."""
    if not movies_file.is_file():
        raise DataError(f"{movies_file}: the genres feature needs the movies file beside the ratings")
    if layout == "tab":
        names = ML100K_GENRES
        per_movie = {m: [names[i] for i, f in enumerate(flags) if f == "1"] for m, flags in _u_item(movies_file)}
    else:
        per_movie = dict(_movies_dat(movies_file) if layout == "dat" else _movies_csv(movies_file))
        names = tuple(sorted({g for genres in per_movie.values() for g in genres}))
    row = {name: i for i, name in enumerate(names)}
    movie_genres = {movie: tuple(row[g] for g in genres) for movie, genres in per_movie.items()}
    return Vocabulary(vocabulary.users, vocabulary.movies, names, movie_genres)


def _rows(ids: set[int] | list[int]) -> dict[int, int]:
    return {id_: row for row, id_ in enumerate(sorted(ids), start=1)}


def _signature(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _u_item(path: Path) -> Iterator[tuple[int, list[str]]]:
    """ml-100k: `id|title|release|video release|url|` then 19 genre flags, latin-1."""
    for number, line in numbered_lines(path):
        if not line.strip():
            continue
        fields = line.decode("latin-1").split("|")
        if len(fields) != 5 + len(ML100K_GENRES):
            raise DataError(f"{path}:{number}: {len(fields)} '|'-separated fields, expected 24")
        yield _movie_id(path, number, fields[0]), fields[-len(ML100K_GENRES) :]


def _movies_dat(path: Path) -> Iterator[tuple[int, list[str]]]:
    """ml-1m / ml-10m: `MovieID::Title::Genre|Genre`, latin-1."""
    for number, line in numbered_lines(path):
        if not line.strip():
            continue
        fields = line.decode("latin-1").split("::")
        if len(fields) != 3:
            raise DataError(f"{path}:{number}: {len(fields)} '::'-separated fields, expected 3")
        yield _movie_id(path, number, fields[0]), _genre_names(fields[2])


def _movies_csv(path: Path) -> Iterator[tuple[int, list[str]]]:
    """ml-latest: `movieId,title,genres` with a header; titles may be quoted."""
    with open(path, newline="", encoding="utf-8", errors="replace") as stream:
        for number, fields in enumerate(csv.reader(stream), start=1):
            if number == 1 or not fields:
                continue
            if len(fields) != 3:
                raise DataError(f"{path}:{number}: {len(fields)} comma-separated fields, expected 3")
            yield _movie_id(path, number, fields[0]), _genre_names(fields[2])


def _genre_names(text: str) -> list[str]:
    return [g for g in text.strip().split("|") if g and g != "(no genres listed)"]


def _movie_id(path: Path, number: int, text: str) -> int:
    if not text.strip().isdigit():
        raise DataError(f"{path}:{number}: column movieId: {text!r} is not a movie id")
    return int(text)
