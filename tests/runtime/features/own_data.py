"""A small ratings table in the layout of specs/examples/movielens_csv.yaml, made with a signal to learn.

    user,movie,genres,age,gender,occupation,zip,year,ts,label

Users and movies fall in two taste groups; a user likes a movie of their own
group 85% of the time, of the other 15%. Some years are empty, zip codes
repeat (a few rare ones), every user rates movies in time order.
"""

from __future__ import annotations

import random
from pathlib import Path

HEADER = "user,movie,genres,age,gender,occupation,zip,year,ts,label"
GENRES = ["Action", "Comedy", "Drama", "Romance", "Thriller", "Children's"]
OCCUPATIONS = ["writer", "student", "engineer", "artist", "doctor"]


def rating_rows(users: int = 40, movies: int = 60, per_user: int = 20, seed: int = 0) -> list[list[str]]:
    """(train rows, test rows): each user's earliest 80% of ratings train, the rest test."""
    rng = random.Random(seed)
    movie_info = []
    for m in range(movies):
        genres = "|".join(sorted(rng.sample(GENRES[:3] if m % 2 else GENRES[3:], rng.randint(1, 2))))
        year = "" if rng.random() < 0.2 else str(rng.randint(1950, 1998))
        movie_info.append((f"m{m}", genres, year))
    rows = []
    for u in range(users):
        age, gender = rng.randint(18, 60), rng.choice("MF")
        occupation, zip_code = rng.choice(OCCUPATIONS), str(10000 + rng.randint(0, 12) * 7 + (u if u % 9 == 0 else 0))
        start = 880000000 + rng.randint(0, 10**6)
        seen = rng.sample(range(movies), per_user)
        for k, m in enumerate(seen):
            name, genres, year = movie_info[m]
            like = rng.random() < (0.85 if m % 2 == u % 2 else 0.15)
            ts = start + 60 * k + (60 if k == 5 else 0)  # one tie: ratings 5 and 6 in the same minute
            rows.append([f"u{u}", name, genres, str(age), gender, occupation, zip_code, year, str(ts), str(int(like))])
    return rows


def split_by_user(rows: list[list[str]], held_out: float = 0.2) -> tuple[list[list[str]], list[list[str]]]:
    """Each user's earliest (1 - held_out) of rows by time train, the rest test."""
    by_user: dict[str, list[list[str]]] = {}
    for row in rows:
        by_user.setdefault(row[0], []).append(row)
    train, test = [], []
    for user_rows in by_user.values():
        user_rows.sort(key=lambda row: int(row[8]))
        cut = round(len(user_rows) * (1 - held_out))
        train += user_rows[:cut]
        test += user_rows[cut:]
    return train, test


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([HEADER, *(",".join(row) for row in rows)]) + "\n")
    return path
