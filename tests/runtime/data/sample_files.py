"""Small data files in the real Criteo and MovieLens formats, and specs that read them."""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Any

from runtime.config.data import DataConfig, DenseFeatureConfig, ModelInputs, SparseFeatureConfig
from runtime.config.heads import HeadConfig
from runtime.config.training import TrainingConfig

# A Criteo row whose click depends on I1 and C1, so a model can learn it.
SIGNAL_HEX = ("0a1b2c3d", "ffee0011")


def criteo_line(rng: random.Random, empty_rate: float = 0.1) -> str:
    signal = rng.random() < 0.5
    label = int(rng.random() < (0.85 if signal else 0.15))
    ints = [str(rng.randint(-3, 500)) if rng.random() > empty_rate else "" for _ in range(13)]
    ints[0] = str(rng.randint(200, 400) if signal else rng.randint(0, 20))
    cats = ["%08x" % rng.getrandbits(32) if rng.random() > empty_rate else "" for _ in range(26)]
    cats[0] = SIGNAL_HEX[0] if signal else SIGNAL_HEX[1]
    return "\t".join([str(label), *ints, *cats])


def criteo_lines(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [criteo_line(rng) for _ in range(count)]


def write_lines(path: Path, lines: list[str], *, gzipped: bool = False, crlf: bool = False) -> Path:
    text = ("\r\n" if crlf else "\n").join(lines) + ("\r\n" if crlf else "\n")
    data = text.encode("latin-1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if gzipped else data)
    return path


def spec(
    dense: list[dict[str, Any]],
    sparse: list[dict[str, Any]],
    tables: dict[str, int],
    heads: list[dict[str, Any]],
    data: dict[str, Any] | None = None,
) -> ModelInputs:
    """The `ModelInputs` a generated module would build for these features, tables and heads."""
    return ModelInputs(
        dense=tuple(DenseFeatureConfig(**f) for f in dense),
        sparse=tuple(SparseFeatureConfig(num_embeddings=tables[f["table"]], **f) for f in sparse),
        heads=tuple(HeadConfig(**h) for h in heads),
        training=TrainingConfig(steps=10, batch_size=8, seed=0),
        data=None if data is None else data_config(data),
    )


def data_config(data: dict[str, Any]) -> DataConfig:
    """The spec's `data:` section as written in YAML, as a `DataConfig`."""
    return DataConfig(data["reader"], data.get("path"), tuple((data.get("columns") or {}).items()))


def criteo_spec(sparse_count: int = 26, rows: int = 1000, data: dict[str, Any] | None = None) -> ModelInputs:
    names = [f"cat_{i}" for i in range(sparse_count)]
    return spec(
        [{"name": "int", "size": 13}],
        [{"name": n, "table": n} for n in names],
        {n: rows for n in names},
        [{"name": "click", "label": "click", "loss": "bce"}],
        data,
    )


def movielens_spec(loss: str = "bce", genres: bool = False, users: int = 50, movies: int = 50) -> ModelInputs:
    sparse = [{"name": "user_id", "table": "user_id"}, {"name": "movie_id", "table": "movie"}]
    tables = {"user_id": users, "movie": movies}
    if genres:
        bag = {"ids_per_sample": 6, "fixed_ids": False, "weighted": True}
        sparse.append({"name": "genres", "table": "genre", **bag})
        tables["genre"] = 19
    return spec([], sparse, tables, [{"name": "like", "label": "like", "loss": loss}])


# (user, movie, rating, timestamp) rows shared by the MovieLens layouts.
RATINGS = [
    (196, 242, 3, 881250949),
    (186, 302, 3, 891717742),
    (22, 377, 1, 878887116),
    (244, 51, 2, 880606923),
    (166, 346, 1, 886397596),
    (298, 474, 4, 884182806),
    (115, 265, 2, 881171488),
    (253, 465, 5, 891628467),
    (305, 451, 3, 886324817),
    (6, 86, 3, 883603013),
]


def write_ml100k(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_lines(directory / "u.data", ["\t".join(map(str, r)) for r in RATINGS])
    flags = ["0"] * 19
    items = []
    for movie in sorted({r[1] for r in RATINGS}):
        row = list(flags)
        row[1 + movie % 18] = "1"
        row[1 + (movie // 7) % 18] = "1"
        items.append("|".join([str(movie), f"Movie {movie} (1995)", "01-Jan-1995", "", "http://x"] + row))
    write_lines(directory / "u.item", items)
    return directory / "u.data"


def write_ml1m(directory: Path, crlf: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_lines(directory / "ratings.dat", ["::".join(map(str, r)) for r in RATINGS], crlf=crlf)
    movies = [
        f"{m}::Café {m} (1995)::Comedy|Drama" if m % 2 else f"{m}::Film {m} (1996)::Action"
        for m in sorted({r[1] for r in RATINGS})
    ]
    write_lines(directory / "movies.dat", movies, crlf=crlf)
    return directory / "ratings.dat"


def write_ml_latest(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [f"{u},{m},{r - 0.5 if u % 2 else r},{t}" for u, m, r, t in RATINGS]
    write_lines(directory / "ratings.csv", ["userId,movieId,rating,timestamp", *rows])
    movies = ["movieId,title,genres"] + [
        f'{m},"Movie, The ({m})",Adventure|Children' if m % 3 else f"{m},Plain {m},(no genres listed)"
        for m in sorted({r[1] for r in RATINGS})
    ]
    (directory / "movies.csv").write_text("\n".join(movies) + "\n", encoding="utf-8")
    return directory / "ratings.csv"
