"""MovieLens-100k leave-one-out: popularity, the shipped two-tower and SASRec, recall@10 and NDCG@10.

The data is RecBole's own copy of MovieLens-100k (`recbole/dataset_example/
ml-100k/ml-100k.inter` inside the `recbole` wheel, fetched with `pip download
--no-deps recbole` into a temporary directory unless `--wheel` names it; it
is never kept or committed). Every rating is an interaction, as RecBole
reads it (`--rating-threshold 0`); `reccompile data split --holdout 1e-9`
holds out each user's latest one by time (leave-one-out). Every model ranks
the held-out movie against the whole catalogue:

    popularity   training counts, nothing masked
    two_tower    specs/two_tower_retrieval.yaml, tables sized for ml-100k,
                 nothing masked (a two-tower head has no mask_seen)
    sasrec       specs/sasrec.yaml, tables sized for ml-100k; the held-out
                 movie ranked among the movies the user's history has not seen
                 (the head's mask_seen default, as RecBole's full-sort metrics)
    hstu         specs/hstu.yaml, likewise

One JSON line per result and seed: {"model", "seed", "recall@10", "ndcg@10",
"users", "epochs", "seconds"}, then one per trained model with the mean over
the seeds ("seed": "mean"). Training runs on one rank with `--threads` torch
threads (1 by default: the machine may be shared).

    python benchmarks/movielens_bench.py [--wheel recbole-1.2.1-py3-none-any.whl] [--epochs N] [--seeds 0,1]

Each model trains its EPOCHS (below) unless `--epochs` says otherwise.

`--precision bf16` trains the specs under `training.precision: bf16`, and
`--in-batch` swaps sasrec's and hstu's 128 uniform negatives for in-batch
ones (the blocked softmax whose products bf16 may narrow): run both ways to
see bf16's move on recall and NDCG.

`--validation` cuts a validation split from the training part the same way
(each user's latest training rating) and trains and reports on it, so the
test part is never looked at while settings are chosen; `--spec PATH`
trains that spec in place of the shipped one (one model in `--models`), and
`--every-epoch` reports the figures after each epoch (one line each, with
its "epoch"), to choose the number of epochs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INTER = "recbole/dataset_example/ml-100k/ml-100k.inter"


def fetch_wheel(into: Path) -> Path:
    """The recbole wheel, downloaded by pip (no dependencies) into `into`."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "recbole", "-q", "-d", str(into)], check=True)
    return next(into.glob("recbole-*.whl"))


def write_ratings(wheel: Path, path: Path) -> int:
    """ml-100k.inter (user_id:token, item_id:token, rating:float, timestamp:float, a header) as u.data lines."""
    with zipfile.ZipFile(wheel) as archive:
        lines = archive.read(INTER).decode().splitlines()[1:]
    rows = [line.split("\t") for line in lines if line.strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{u}\t{i}\t{r}\t{int(float(t))}\n" for u, i, r, t in rows))
    return len(rows)


def reccompile(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "compiler.cli", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"reccompile {' '.join(args)} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr}"
        )
    return done.stdout


def leave_one_out(ratings: Path, into: Path) -> None:
    """`reccompile data split` of a u.data file into `into`/train and /test, each user's latest rating held out."""
    reccompile(
        "data",
        "split",
        "--data",
        f"movielens:{ratings}",
        "--holdout",
        "1e-9",
        "--rating-threshold",
        "0",
        "-o",
        str(into),
    )


def read(path: Path) -> list[tuple[int, int, int]]:
    return [(int(u), int(i), int(t)) for u, i, _, t in (line.split("\t") for line in path.read_text().splitlines())]


def popularity(train: list[tuple[int, int, int]], test: list[tuple[int, int, int]], k: int = 10) -> dict[str, float]:
    """The held-out movie's rank among all movies ordered by training count (ties against it)."""
    counts = Counter(movie for _, movie, _ in train)
    catalogue = set(counts) | {movie for _, movie, _ in test}
    recall = ndcg = 0.0
    for _, movie, _ in test:
        mine = counts.get(movie, 0)
        position = sum(1 for other in catalogue if other != movie and counts.get(other, 0) >= mine)
        if position < k:
            recall += 1
            ndcg += 1 / math.log2(position + 2)
    return {"recall@10": recall / len(test), "ndcg@10": ndcg / len(test)}


def sized_spec(spec: Path, out: Path, users: int, movies: int, precision: str = "fp32", in_batch: bool = False) -> Path:
    """`spec` with its user and item tables sized for ml-100k's ids (plus row 0 for unseen ones),
    trained in `precision`, with in-batch negatives in place of uniform ones if `in_batch`."""
    text = spec.read_text()
    text = re.sub(r"num_embeddings: 6041", f"num_embeddings: {users + 1}", text)
    text = re.sub(r"num_embeddings: 3953", f"num_embeddings: {movies + 1}", text)
    if precision != "fp32":
        text = re.sub(r"^training:\n", f"training:\n  precision: {precision}\n", text, flags=re.M)
    if in_batch:
        text = re.sub(r"negatives: \{uniform: \d+\}", "negatives: {in_batch: true}", text)
    out.write_text(text)
    return out


# Each model's passes over the training part: sasrec's chosen on the validation split (recall@10 still rose after
# 10 epochs on seeds 0 and 1: epochs 11-15 above 6-10 on both); the others' not tuned.
EPOCHS = {"two_tower": 10, "sasrec": 15, "hstu": 10}


def schedule(epochs: int, rows: int, batch: int, every_epoch: bool) -> tuple[int, int | None]:
    """The training steps, whole epochs of `rows // batch` steps, and the steps between evaluations (None: one at
    the end). A run evaluated every epoch therefore trains, up to each epoch, what a run of that many epochs does."""
    per_epoch = max(1, rows // batch)
    return epochs * per_epoch, per_epoch if every_epoch else None


def eval_passes(metrics_jsonl: Path) -> list[dict[str, float]]:
    """Each evaluation pass's metrics, in order, from a run log's metrics.jsonl (one evaluated data set)."""
    records = [json.loads(line) for line in metrics_jsonl.read_text().splitlines()]
    return [next(iter(record["metrics"].values())) for record in records if record["kind"] == "eval"]


def trained(
    spec: Path, split: Path, work: Path, epochs: int, rows: int, seed: int, threads: int, every_epoch: bool = False
) -> list[dict[str, float]]:
    """Train `spec` on the split's training part for `epochs`, evaluated on its test part: the last eval
    metrics, or with `every_epoch` each epoch's (the last epoch's last)."""
    batch = int(re.search(r"batch_size: (\d+)", spec.read_text()).group(1))
    steps, eval_every = schedule(epochs, rows, batch, every_epoch)
    logs = work / f"{spec.stem}-logs"
    per_epoch = () if eval_every is None else ("--eval-every", str(eval_every), "--log-dir", str(logs))
    out = reccompile(
        "train",
        str(spec),
        "--data",
        f"movielens:{split / 'train' / 'u.data'}",
        "--rating-threshold",
        "0",
        "--eval-data",
        f"movielens:{split / 'test' / 'u.data'}",
        "--steps",
        str(steps),
        "--log-every",
        str(steps),
        "--seed",
        str(seed),
        "--threads",
        str(threads),
        "-o",
        str(work / spec.stem),
        *per_epoch,
    )
    if every_epoch:
        passes = eval_passes(logs / "metrics.jsonl")
    else:
        passes = list(json.loads(out.strip().splitlines()[-1])["eval_metrics"].values())
    return [{"recall@10": metrics["recall@10"], "ndcg@10": metrics["ndcg@10"]} for metrics in passes]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="the recbole wheel (default: pip download it)")
    parser.add_argument("--epochs", type=int, help="passes over the training part (each model's EPOCHS)")
    parser.add_argument("--models", default="popularity,two_tower,sasrec,hstu")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training run (1)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="training.precision (fp32)")
    parser.add_argument("--in-batch", action="store_true", help="sasrec and hstu: in-batch negatives, not uniform")
    parser.add_argument(
        "--validation", action="store_true", help="train and report on a validation split cut from the training part"
    )
    parser.add_argument("--spec", type=Path, help="train this spec in place of the shipped one (one model)")
    parser.add_argument("--every-epoch", action="store_true", help="report the figures after each epoch")
    args = parser.parse_args(argv)
    if args.spec and len(args.models.split(",")) != 1:
        parser.error("--spec needs exactly one model in --models")
    return args


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="movielens-bench-") as folder:
        work = Path(folder)
        wheel = args.wheel or fetch_wheel(work)
        ratings = work / "ml-100k" / "u.data"
        write_ratings(wheel, ratings)
        split = work / "split"
        leave_one_out(ratings, split)
        if args.validation:
            leave_one_out(split / "train" / "u.data", work / "validation")
            split = work / "validation"
        train, test = read(split / "train" / "u.data"), read(split / "test" / "u.data")
        users, movies = len({u for u, _, _ in train}), len({m for _, m, _ in train})
        seeds = [int(seed) for seed in args.seeds.split(",")]
        for model in args.models.split(","):
            if model == "popularity":
                started = time.perf_counter()
                report(model, None, popularity(train, test), len(test), None, started)
                continue
            shipped = {"two_tower": "two_tower_retrieval.yaml", "sasrec": "sasrec.yaml", "hstu": "hstu.yaml"}[model]
            spec = sized_spec(
                args.spec or REPO / "specs" / shipped,
                work / f"{model}.yaml",
                users,
                movies,
                args.precision,
                args.in_batch,
            )
            runs, epochs = [], args.epochs or EPOCHS[model]
            for seed in seeds:
                started = time.perf_counter()
                passes = trained(spec, split, work, epochs, len(train), seed, args.threads, args.every_epoch)
                for epoch, figures in enumerate(passes[:-1], start=1):
                    report(model, seed, figures, len(test), epoch, None)
                runs.append(passes[-1])
                report(model, seed, runs[-1], len(test), epochs, started)
            if len(runs) > 1:
                mean = {name: sum(run[name] for run in runs) / len(runs) for name in runs[0]}
                report(model, "mean", mean, len(test), epochs, None)


def report(
    model: str, seed: int | str | None, figures: dict[str, float], users: int, epochs: int | None, started: float | None
) -> None:
    """One JSON line: the model's figures, the seed (None for popularity, "mean" over seeds) and the time taken."""
    seconds = None if started is None else round(time.perf_counter() - started, 1)
    print(
        json.dumps(
            {
                "model": model,
                "seed": seed,
                **{k: round(v, 4) for k, v in figures.items()},
                "users": users,
                "epochs": epochs,
                "seconds": seconds,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
