"""own-data-bench: MovieLens-100k as a plain CSV of your own, through features learned once.

Writes MovieLens-100k (the atomic files the `recbole` wheel ships; `pip
download recbole --no-deps`, or --wheel PATH) in the layout of
specs/examples/movielens_csv.yaml:

    user,movie,genres,age,gender,occupation,zip,year,ts,label      (u12, m345, Comedy|Romance, ...)

each user's earliest 80% of ratings (by time, file order among ties) to
train.csv (rows shuffled, seeded), the last 20% to test.csv, label rating >= 4.
Then, with the example spec, for each --seeds:

    select     the number of steps, never picked on test: `data split` cuts each user's latest 20% of
               train.csv into a validation part; train on the rest with --eval-data on it, evaluating
               every --eval-every steps up to --steps, --best-metric auc --patience 3; the best pass's
               epochs, scaled to the whole of train.csv, are the steps of the runs below
    direct     train --data csv:train.csv --eval-data csv:test.csv: held-out AUC
    prepared   data prepare of both (test with --training), train on them: held-out AUC
    predict    export + predict test.csv: the AUC of its scores
    prepare    `data prepare` rows/s of train.csv (its learning pass included) for the example without
               its history (vocabularies, normalisers, quantiles, a cross) against the same spec with
               every learned transform replaced by hashing, and for the whole example (--repeats times
               each, alternating, median; on a shared machine: noisy)

One JSON line per result, then an `own_data_summary` line. Never writes the
data anywhere but --workdir.

    python benchmarks/own_data_bench.py [--wheel recbole.whl] [--workdir DIR] [--steps 1500] [--seeds 0 1]
                                        [--eval-every 125] [--repeats 3]
    python benchmarks/own_data_bench.py --write-csv data/      # only write train.csv and test.csv
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import platform
import random
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compiler.cli import main as reccompile  # noqa: E402
from runtime.reporting.metrics import auc  # noqa: E402  the AUC training reports

SPEC = REPO / "specs" / "examples" / "movielens_csv.yaml"
HEADER = ["user", "movie", "genres", "age", "gender", "occupation", "zip", "year", "ts", "label"]
ATOMIC = "recbole/dataset_example/ml-100k/ml-100k."
BOUNDARIES = {"age": [20, 25, 30, 35, 40, 45, 50], "year": [1960, 1980, 1990, 1993, 1995, 1996, 1997]}  # `hash`


def atomic_files(wheel: Path | None, workdir: Path) -> dict[str, list[list[str]]]:
    """The inter, user and item atomic files of ml-100k (rows of tab-separated fields, header dropped)."""
    if wheel is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "recbole", "--no-deps", "-d", str(workdir)],
            check=True,
            capture_output=True,
        )
        wheel = next(workdir.glob("recbole-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return {
            kind: [line.split("\t") for line in archive.read(ATOMIC + kind).decode().splitlines()[1:]]
            for kind in ("inter", "user", "item")
        }


def write_csvs(files: dict[str, list[list[str]]], directory: Path, held_out: float = 0.2) -> tuple[Path, Path]:
    users = {row[0]: row[1:] for row in files["user"]}
    # a year that is no number ('unkonwn' in ml-100k) is written empty: the spec fills it with the mean
    items = {row[0]: (row[2] if row[2].isdigit() else "", "|".join(row[3].split())) for row in files["item"]}
    by_user: dict[str, list[tuple[int, int, list[str]]]] = {}
    for order, (user, item, rating, ts) in enumerate(files["inter"]):
        age, gender, occupation, zip_code = users[user]
        year, genres = items[item]
        row = [
            f"u{user}",
            f"m{item}",
            genres,
            age,
            gender,
            occupation,
            zip_code,
            year,
            str(int(float(ts))),
            str(int(float(rating) >= 4)),
        ]
        by_user.setdefault(user, []).append((int(float(ts)), order, row))
    train, test = [], []
    for rows in by_user.values():
        rows.sort()
        cut = round(len(rows) * (1 - held_out))
        train += [row for _, _, row in rows[:cut]]
        test += [row for _, _, row in rows[cut:]]
    random.Random(0).shuffle(train)
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "train.csv", directory / "test.csv"
    for path, rows in zip(paths, (train, test)):
        with open(path, "w", newline="") as stream:
            writer = csv.writer(stream, lineterminator="\n")
            writer.writerow(HEADER)
            writer.writerows(rows)
    return paths


def run(*args: str) -> str:
    """One reccompile command in this process; its stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = reccompile(list(args))
    if status != 0:
        raise SystemExit(f"reccompile {' '.join(args)} exited {status}")
    return out.getvalue()


def result_of(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def timing_specs(workdir: Path) -> dict[str, Path]:
    """The example spec without its histories, sparse and dense (`vocabulary`: vocabularies, normalisers,
    quantiles, a cross), the same with every learned transform replaced by hashing into tables of the same
    rows (`hash`), and the example itself (`example`, with the histories), for prepare's rows/s."""
    spec = yaml.safe_load(SPEC.read_text())
    histories = {
        f"{kind}.{f['name']}" for kind in ("sparse", "dense") for f in spec["features"][kind] if "history" in f
    }
    for kind in ("sparse", "dense"):
        spec["features"][kind] = [f for f in spec["features"][kind] if "history" not in f]
    readers = {name for name, block in spec["model"].items() if str(block["input"]) in histories}  # pools, attention
    for name in readers:  # the blocks that read a history, and their place in every other block's inputs
        del spec["model"][name]
    for block in spec["model"].values():
        if isinstance(block["input"], list):
            block["input"] = [name for name in block["input"] if name not in readers | histories]
    learned = json.loads(json.dumps(spec))
    for feature in spec["features"]["dense"]:
        feature.pop("transform", None)
    for feature in spec["features"]["sparse"]:
        vocabulary = feature.pop("vocabulary", None)
        if vocabulary is not None and feature.get("num_embeddings") == "auto":
            feature["num_embeddings"] = vocabulary["max_size"] + vocabulary.get("oov_buckets", 1)
        if feature.pop("quantiles", None) is not None:
            feature["boundaries"] = BOUNDARIES[feature["column"]]
            feature["num_embeddings"] = len(feature["boundaries"]) + 1
    paths = {"example": SPEC}
    for kind, body in (("vocabulary", learned), ("hash", spec)):
        body["name"] = f"movielens_csv_{kind}"
        paths[kind] = workdir / f"movielens_csv_{kind}.yaml"
        paths[kind].write_text(yaml.safe_dump(body, sort_keys=False))
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="the recbole wheel (default: pip download it into --workdir)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/reccompile_own_data_bench"))
    parser.add_argument("--steps", type=int, default=1500, help="at most this many steps in the selection run")
    parser.add_argument("--eval-every", type=int, default=125, help="steps between validation passes (selection)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="a whole run per seed")
    parser.add_argument("--repeats", type=int, default=3, help="prepare timings per spec, alternating (0: none)")
    parser.add_argument("--write-csv", type=Path, metavar="DIR", help="only write DIR/train.csv and DIR/test.csv")
    parser.add_argument("--prepare-only", action="store_true", help="only the prepare rows/s (no training)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    files = atomic_files(args.wheel, args.workdir)
    if args.write_csv is not None:
        for path in write_csvs(files, args.write_csv):
            print(f"wrote {path}")
        return 0
    train, test = write_csvs(files, args.workdir / "data")
    work = args.workdir
    if args.prepare_only:
        print(json.dumps({"own_data_summary": True, **prepare_rates(work, train, args.repeats)}))
        return 0
    for name in ("prep_train", "prep_test", "split"):
        shutil.rmtree(work / name, ignore_errors=True)  # a run starts afresh
    run("data", "split", "--data", f"csv:{train}", "-o", str(work / "split"), "--time", "ts", "--key", "user")
    for name, data, extra in (("prep_train", train, []), ("prep_test", test, ["--training", str(train)])):
        run("data", "prepare", str(SPEC), "--data", f"csv:{data}", "-o", str(work / name), *extra)
    runs = [one_seed(work, train, test, seed, args) for seed in args.seeds]
    rates = prepare_rates(work, train, args.repeats) if args.repeats else {}
    print(json.dumps({"own_data_summary": True, "runs": runs, **rates}))
    return 0


def one_seed(work: Path, train: Path, test: Path, seed: int, args: argparse.Namespace) -> dict[str, object]:
    """select, direct, prepared and predict (the module docstring) with `seed`; their figures."""
    tag = f"seed{seed}"
    for name in ("ckpt", "ckpt_select", "build", "build_select", "build_prepared", "served"):
        shutil.rmtree(work / f"{name}_{tag}", ignore_errors=True)
    common = ["--data-workers", "0", "--seed", str(seed)]
    split = work / "split"
    selected = result_of(
        run(
            "train",
            str(SPEC),
            "--data",
            f"csv:{split}/train",
            "--eval-data",
            f"csv:{split}/test",
            "--steps",
            str(args.steps),
            "--eval-every",
            str(args.eval_every),
            "--best-metric",
            "auc",
            "--patience",
            "3",
            "--checkpoint-dir",
            str(work / f"ckpt_select_{tag}"),
            *common,
            "-o",
            str(work / f"build_select_{tag}"),
        )
    )
    best = selected["best"]
    steps = round(best["step"] * _rows(train) / _rows(split / "train" / "train.csv"))  # the same epochs
    print(
        json.dumps(
            {"path": "select", "seed": seed, "validation_auc": best["value"], "best_step": best["step"], "steps": steps}
        )
    )
    common += ["--steps", str(steps)]
    direct = result_of(
        run(
            "train",
            str(SPEC),
            "--data",
            f"csv:{train}",
            "--eval-data",
            f"csv:{test}",
            *common,
            "--checkpoint-dir",
            str(work / f"ckpt_{tag}"),
            "--checkpoint-every",
            str(steps),
            "-o",
            str(work / f"build_{tag}"),
        )
    )
    print(
        json.dumps(
            {
                "path": "direct",
                "seed": seed,
                "auc": direct["eval_metrics"]["like"]["auc"],
                "unseen": direct["eval_unseen_ids"],
            }
        )
    )
    prepared = result_of(
        run(
            "train",
            str(SPEC),
            "--data",
            f"prepared:{work}/prep_train",
            "--eval-data",
            f"prepared:{work}/prep_test",
            *common,
            "-o",
            str(work / f"build_prepared_{tag}"),
        )
    )
    print(json.dumps({"path": "prepared", "seed": seed, "auc": prepared["eval_metrics"]["like"]["auc"]}))
    served = work / f"served_{tag}"
    run(
        "export",
        str(SPEC),
        "--checkpoint",
        str(work / f"ckpt_{tag}"),
        "--quantize",
        "none",
        "--no-aot",
        "-o",
        str(served),
    )
    run("predict", str(served), "--data", f"csv:{test}", "-o", str(work / f"scores_{tag}.csv"))
    with open(work / f"scores_{tag}.csv") as scores, open(test) as lines:
        scored = [float(r["like"]) for r in csv.DictReader(scores)]
        predicted = auc(torch.tensor(scored), torch.tensor([float(r["label"]) for r in csv.DictReader(lines)]))
    print(json.dumps({"path": "predict", "seed": seed, "auc": predicted}))
    return {
        "seed": seed,
        "steps": steps,
        "validation_auc": best["value"],
        "auc_direct": direct["eval_metrics"]["like"]["auc"],
        "auc_prepared": prepared["eval_metrics"]["like"]["auc"],
        "auc_predict": predicted,
    }


def _rows(path: Path) -> int:
    """The data rows of a CSV file (its lines but the header)."""
    with open(path) as stream:
        return sum(1 for _ in stream) - 1


def prepare_rates(work: Path, train: Path, repeats: int) -> dict[str, object]:
    """`data prepare` rows/s of `train` per timing spec: the median of `repeats`, the specs alternating."""
    specs = timing_specs(work)
    timings: dict[str, list[float]] = {kind: [] for kind in specs}
    rows = sum(1 for _ in open(train)) - 1
    for repeat in range(repeats):
        for kind, spec in specs.items():
            out = work / f"prep_{kind}_{repeat}"
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            run("data", "prepare", str(spec), "--data", f"csv:{train}", "-o", str(out), "--workers", "0")
            timings[kind].append(rows / (time.perf_counter() - started))
    median = {kind: sorted(rates)[len(rates) // 2] for kind, rates in timings.items()}
    for kind, rates in timings.items():
        print(json.dumps({"path": f"prepare_{kind}", "rows_per_s": median[kind], "all": rates}))
    return {
        "prepare_rows_per_s_vocabulary": median["vocabulary"],
        "prepare_rows_per_s_hash": median["hash"],
        "prepare_rows_per_s_example": median["example"],
        "vocabulary_over_hash": median["vocabulary"] / median["hash"],
        "train_rows": rows,
        "cpu": _cpu(),
    }


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


if __name__ == "__main__":
    sys.exit(main())
