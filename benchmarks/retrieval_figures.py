"""The figures of a two-tower retrieval run: recall@10 / NDCG@10 per epoch and the index's recall.

    python benchmarks/retrieval_figures.py [--users 2000] [--movies 1000] [--epochs 4] [--workdir DIR]

Generates a MovieLens-format ratings.dat with a planted signal (user u rates
5 a random half of the movies of its group, u mod GROUPS, and 2 a few others,
which are no positives), then runs the reccompile commands it prints:

    reccompile data split --data movielens:DIR/ratings.dat --holdout 0.2 -o DIR/split
    reccompile train specs/two_tower_retrieval.yaml --data movielens:DIR/split/train/ratings.dat
        --eval-data movielens:DIR/split/test/ratings.dat --eval-every STEPS_PER_EPOCH
        --steps EPOCHS*STEPS_PER_EPOCH --log-dir DIR/log --checkpoint-dir DIR/ckpt -o DIR/build
    reccompile export specs/two_tower_retrieval.yaml --checkpoint DIR/ckpt --index KIND
        --eval-data movielens:DIR/split/test/ratings.dat -o DIR/export-KIND     (flat, ivf, hnsw)

and prints one line per epoch (recall@10, ndcg@10 of the held-out positives
ranked against the whole item table, from the run log), the recall@10 of
a popularity ranking (the 10 most-rated training movies), and one per index
kind (its recall@100 against exact search's, from the export's manifest).
tests/benchmarks/test_retrieval_figures.py runs it at a small size.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "two_tower_retrieval.yaml"
GROUPS = 20
INDEX_KINDS = ("flat", "ivf", "hnsw")


@dataclass(frozen=True)
class Figures:
    epochs: list[dict[str, float]]  # per epoch: step, recall@10, ndcg@10
    indexes: dict[str, dict[str, float]]  # kind -> recall, exact_recall, ratio
    popularity: float  # recall@10 of the 10 most-rated training movies for everyone
    commands: list[str]


def write_ratings(path: Path, users: int, movies: int, seed: int = 0) -> int:
    """A ratings.dat of `users` x (half their group's movies at 5, 3 others at 2); returns the positives."""
    rng = random.Random(seed)
    lines, positives = [], 0
    for user in range(1, users + 1):
        group = [m for m in range(1, movies + 1) if m % GROUPS == user % GROUPS]
        liked = rng.sample(group, len(group) // 2)
        others = rng.sample([m for m in range(1, movies + 1) if m % GROUPS != user % GROUPS], 3)
        rated = [(m, 5) for m in liked] + [(m, 2) for m in others]
        rng.shuffle(rated)
        lines += [f"{user}::{m}::{stars}::{1000 * user + t}" for t, (m, stars) in enumerate(rated)]
        positives += len(liked)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return positives


def run(workdir: Path, users: int, movies: int, epochs: int, spec: Path = SPEC) -> Figures:
    """Generate, split, train, export with each index kind; the figures and the commands run."""
    ratings = workdir / "ratings.dat"
    write_ratings(ratings, users, movies)
    commands: list[str] = []

    def cli(*args: str) -> None:
        commands.append("reccompile " + " ".join(args))
        subprocess.run([sys.executable, "-m", "compiler.cli", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)

    split, log = workdir / "split", workdir / "log"
    cli("data", "split", "--data", f"movielens:{ratings}", "--holdout", "0.2", "-o", str(split))
    train, test = split / "train" / "ratings.dat", split / "test" / "ratings.dat"
    batch = _batch_size(spec)
    per_epoch = max(1, len(train.read_text().splitlines()) // batch)
    cli(
        "train",
        str(spec),
        "--data",
        f"movielens:{train}",
        "--eval-data",
        f"movielens:{test}",
        "--eval-every",
        str(per_epoch),
        "--steps",
        str(epochs * per_epoch),
        "--log-every",
        str(per_epoch),
        "--log-dir",
        str(log),
        "--checkpoint-dir",
        str(workdir / "ckpt"),
        "-o",
        str(workdir / "build"),
    )
    indexes = {}
    for kind in INDEX_KINDS:
        out = workdir / f"export-{kind}"
        cli(
            "export",
            str(spec),
            "--checkpoint",
            str(workdir / "ckpt"),
            "--index",
            kind,
            "--eval-data",
            f"movielens:{test}",
            "-o",
            str(out),
        )
        quality = json.loads((out / "manifest.json").read_text())["retrieval"]["quality"]
        indexes[kind] = {key: quality[key] for key in ("k", "queries", "recall", "exact_recall", "ratio")}
    return Figures(_epochs(log / "metrics.jsonl"), indexes, popularity_recall(train, test), commands)


def popularity_recall(train: Path, test: Path, k: int = 10) -> float:
    """The share of `test`'s positives among the k movies with the most positives in `train`."""
    counts: dict[int, int] = {}
    for line in train.read_text().splitlines():
        movie = int(line.split("::")[1])
        counts[movie] = counts.get(movie, 0) + 1
    top = set(sorted(counts, key=lambda m: (-counts[m], m))[:k])
    held_out = [int(line.split("::")[1]) for line in test.read_text().splitlines()]
    return sum(movie in top for movie in held_out) / len(held_out)


def _batch_size(spec: Path) -> int:
    import yaml

    return int(yaml.safe_load(spec.read_text())["training"]["batch_size"])


def _epochs(metrics: Path) -> list[dict[str, float]]:
    """The evaluations of the run log: step, recall@10 and ndcg@10 of the retrieval head."""
    rows = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] != "eval":
            continue
        (head,) = record["metrics"].values()
        rows.append({"step": record["step"], "recall@10": head["recall@10"], "ndcg@10": head["ndcg@10"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--movies", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/retrieval_figures"))
    args = parser.parse_args()
    figures = run(args.workdir, args.users, args.movies, args.epochs)
    for command in figures.commands:
        print(command)
    for number, epoch in enumerate(figures.epochs, start=1):
        print(
            f"epoch {number} (step {epoch['step']}): recall@10 {epoch['recall@10']:.4f}  ndcg@10 {epoch['ndcg@10']:.4f}"
        )
    print(f"popularity baseline: recall@10 {figures.popularity:.4f}")
    for kind, quality in figures.indexes.items():
        print(
            f"index {kind}: recall@{quality['k']} {quality['recall']:.4f} vs exact {quality['exact_recall']:.4f} "
            f"(ratio {quality['ratio']:.4f}, {quality['queries']} queries)"
        )


if __name__ == "__main__":
    main()
