"""`reccompile train --best-metric M --patience P` on MovieLens-100k's `u.data` format.

The ratings carry a planted signal (a user and a movie bias) under noise
that the model memorises: the held-out AUC peaks after about an epoch and
falls after it, as the issue saw on the real data. The run must keep the
peak in DIR/best, stop P evaluations after it, say so, and that checkpoint
must resume, export and predict with the peak's AUC; two ranks decide alike.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.reporting.metrics import auc

REPO = Path(__file__).resolve().parents[3]
EVERY, PATIENCE, STEPS = 25, 3, 400

SPEC = """\
version: 1
name: ml_deepfm
features:
  sparse:
    - {name: user_id, num_embeddings: 401, dim: 16}
    - {name: movie_id, num_embeddings: 301, dim: 16}
model:
  linear: {type: mlp, input: sparse.*, layers: [1], final_activation: none}
  fm:     {type: fm, input: sparse.*}
  deep:   {type: mlp, input: sparse.*, layers: [64, 1], final_activation: none}
  logit:  {type: sum, input: [linear, fm, deep]}
heads:
  - {name: click, input: logit, loss: bce}
training:
  batch_size: 256
  dense_optimizer:  {type: adam, lr: 0.01}
  sparse_optimizer: {type: adagrad, lr: 0.1}
"""


def write_ratings(directory: Path, users: int = 400, movies: int = 300, per_user: int = 40) -> tuple[Path, Path]:
    """`train/u.data` and `eval/u.data` (user \\t item \\t rating \\t timestamp, shuffled as ml-100k's
    lines are), the last 20% of each user's ratings by time held out."""
    rng = random.Random(0)
    user_bias = [rng.gauss(0, 1) for _ in range(users)]
    movie_bias = [rng.gauss(0, 1) for _ in range(movies)]
    train, held_out = [], []
    for user in range(1, users + 1):
        times = sorted(rng.sample(range(874_000_000, 893_000_000), per_user))
        rows = []
        for time, movie in zip(times, rng.sample(range(1, movies + 1), per_user)):
            score = user_bias[user - 1] + movie_bias[movie - 1] + rng.gauss(0, 1.5)
            rating = 5 if score > 0.8 else 4 if score > 0 else 3 if score > -0.8 else 2
            rows.append(f"{user}\t{movie}\t{rating}\t{time}")
        cut = len(rows) * 4 // 5
        train += rows[:cut]
        held_out += rows[cut:]
    paths = []
    for name, rows in (("train", train), ("eval", held_out)):
        rng.shuffle(rows)
        (directory / name).mkdir()
        path = directory / name / "u.data"
        path.write_text("\n".join(rows) + "\n")
        paths.append(path)
    return paths[0], paths[1]


@dataclass(frozen=True)
class Ran:
    stdout: str
    stderr: str


def _reccompile(*args: str) -> Ran:
    """`reccompile ARGS` through compiler.cli.main in this process (one torch import for the module's
    many runs), its output captured; it must succeed. Two ranks start their own torchrun workers."""
    if "--nproc" in args:
        done = subprocess.run(
            [sys.executable, "-m", "compiler.cli", *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        )
        assert done.returncode == 0, done.stderr
        return Ran(done.stdout, done.stderr)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    assert code == 0, err.getvalue()
    return Ran(out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def ratings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("movielens")
    spec = directory / "ml_deepfm.yaml"
    spec.write_text(SPEC)
    return (spec, *write_ratings(directory))


def _train(ratings: tuple[Path, Path, Path], out: Path, *extra: str) -> Ran:
    spec, train, held_out = ratings
    return _reccompile(
        "train",
        str(spec),
        "--steps",
        str(STEPS),
        "--data",
        f"movielens:{train}",
        "--eval-data",
        f"movielens:{held_out}",
        "--eval-every",
        str(EVERY),
        "--log-every",
        "100",
        "--best-metric",
        "auc",
        "--patience",
        str(PATIENCE),
        "--checkpoint-dir",
        str(out / "ck"),
        "--log-dir",
        str(out / "logs"),
        "-o",
        str(out / "build"),
        *extra,
    )


@pytest.fixture(scope="module")
def one_rank(ratings: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("one_rank")
    done = _train(ratings, out)
    return out, {"stdout": done.stdout, "result": json.loads(done.stdout.splitlines()[-1])}


def _records(out: Path, kind: str) -> list[dict]:
    lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["kind"] == kind]


def test_the_best_checkpoint_holds_the_peak_and_training_stops_after_patience(one_rank: tuple[Path, dict]) -> None:
    out, run = one_rank
    evals = [(r["step"], r["metrics"]["click"]["auc"]) for r in _records(out, "eval")]
    peak_step, peak = max(evals, key=lambda e: e[1])
    # The planted noise is memorised: the peak comes early and the curve falls after it.
    assert peak_step < STEPS // 2 and evals[-1][1] < peak - 0.002, evals
    stop = peak_step + PATIENCE * EVERY
    assert [s for s, _ in evals] == list(range(EVERY, stop + 1, EVERY))
    reason = f"click.auc did not improve for {PATIENCE} evaluations (best {peak:g} at step {peak_step})"
    result = run["result"]
    assert result["steps"] == stop
    assert result["stopped_early"] == {"step": stop, "reason": reason}
    best_dir = out / "ck" / "best" / f"step_{peak_step:08d}"
    assert result["best"] == {"metric": "click.auc", "value": peak, "step": peak_step, "checkpoint": str(best_dir)}
    assert f"stopped early at step {stop}/{STEPS}: {reason}" in run["stdout"].splitlines()
    assert _records(out, "stop") == [{"kind": "stop", "step": stop, "reason": reason}]
    kept = [p.name for p in (out / "ck" / "best").iterdir() if p.name != ".lock"]
    assert kept == [best_dir.name]  # the one best, whole: earlier bests pruned, no .partial left
    manifest = json.loads((best_dir / "manifest.json").read_text())
    assert manifest["step"] == peak_step
    assert manifest["early_stopping"] == {
        "metric": "click.auc",
        "value": peak,
        "step": peak_step,
        "since_best": 0,
        "last_step": peak_step,
    }
    assert sorted(p.name for p in (out / "ck").iterdir() if p.name.startswith("step_")) == [f"step_{stop:08d}"]


def test_the_best_checkpoint_resumes_with_the_peak_value(
    ratings: tuple[Path, Path, Path], one_rank: tuple[Path, dict]
) -> None:
    out, run = one_rank
    best = run["result"]["best"]
    spec, _, held_out = ratings
    # Resumed at its own step with nothing left to train: the final evaluation scores it as saved.
    done = _reccompile(
        "train",
        str(spec),
        "--steps",
        str(best["step"]),
        "--eval-data",
        f"movielens:{held_out}",
        "--checkpoint-dir",
        str(out / "ck" / "best"),
        "--resume",
        "-o",
        str(out / "resumed"),
        "--data",
        f"movielens:{ratings[1]}",
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["eval_metrics"]["click"]["auc"] == best["value"]
    assert result["eval_seconds"] > 0  # the final evaluation, its only one, counts


def test_the_best_checkpoint_exports_and_predicts_the_peak_auc(
    ratings: tuple[Path, Path, Path], one_rank: tuple[Path, dict], tmp_path: Path
) -> None:
    out, run = one_rank
    spec, _, held_out = ratings
    _reccompile("export", str(spec), "--checkpoint", str(out / "ck" / "best"), "--no-aot", "-o", str(tmp_path / "x"))
    _reccompile("predict", str(tmp_path / "x"), "--data", f"movielens:{held_out}", "-o", str(tmp_path / "p.csv"))
    with open(tmp_path / "p.csv") as file:
        scores = [float(row["click"]) for row in csv.DictReader(file)]
    labels = [float(int(line.split("\t")[2]) >= 4) for line in held_out.read_text().splitlines()]
    predicted = auc(torch.tensor(scores, dtype=torch.float64), torch.tensor(labels, dtype=torch.float64))
    # Probabilities printed to 9 digits rank the samples as the logits do; the logged value has 6.
    assert predicted == pytest.approx(run["result"]["best"]["value"], abs=5e-7)


def test_two_ranks_keep_the_same_best_and_stop_at_the_same_step(
    ratings: tuple[Path, Path, Path], one_rank: tuple[Path, dict], tmp_path: Path
) -> None:
    _, run = one_rank
    two = json.loads(_train(ratings, tmp_path, "--nproc", "2").stdout.splitlines()[-1])
    assert two["stopped_early"]["step"] == run["result"]["stopped_early"]["step"]
    assert two["best"]["step"] == run["result"]["best"]["step"]
    assert two["best"]["value"] == pytest.approx(run["result"]["best"]["value"], abs=2e-6)


def test_a_resumed_run_stops_where_the_uninterrupted_one_did(
    ratings: tuple[Path, Path, Path], one_rank: tuple[Path, dict], tmp_path: Path
) -> None:
    _, run = one_rank
    best = run["result"]["best"]
    # Saved at step 75 before that step's final evaluation: the resumed run evaluates it first.
    _train(ratings, tmp_path, "--steps", "75", "--checkpoint-every", str(EVERY))
    done = _train(ratings, tmp_path, "--resume")
    resumed = json.loads(done.stdout.splitlines()[-1])
    assert resumed["stopped_early"] == run["result"]["stopped_early"]
    assert resumed["best"] == {**best, "checkpoint": str(tmp_path / "ck" / "best" / f"step_{best['step']:08d}")}
    stop = resumed["stopped_early"]["step"]
    assert [r["step"] for r in _records(tmp_path, "eval")] == [25, 50, 75, 75, *range(100, stop + 1, EVERY)]


def test_resuming_a_run_that_stopped_early_trains_no_further_step(
    ratings: tuple[Path, Path, Path], one_rank: tuple[Path, dict], tmp_path: Path
) -> None:
    out, run = one_rank
    shutil.copytree(out / "ck", tmp_path / "ck", ignore=shutil.ignore_patterns(".lock"))
    stopped = run["result"]["stopped_early"]
    # The same run again: its saved tracker already says stop, so it stops where it had (it trained one
    # step more and saved it, before).
    done = _train(ratings, tmp_path, "--resume")
    resumed = json.loads(done.stdout.splitlines()[-1])
    assert resumed["steps"] == 0
    assert resumed["stopped_early"] == stopped
    assert f"stopped early at step {stopped['step']}/{STEPS}: {stopped['reason']}" in done.stdout.splitlines()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("step_")) == [
        f"step_{stopped['step']:08d}"
    ]


def test_the_specs_training_early_stopping_stops_alike_and_the_flags_override_it(
    ratings: tuple[Path, Path, Path], one_rank: tuple[Path, dict], tmp_path: Path
) -> None:
    spec, train, held_out = ratings
    stopping = tmp_path / "ml_deepfm.yaml"
    stopping.write_text(SPEC + f"  early_stopping: {{metric: auc, patience: {PATIENCE}}}\n")
    common = ["--steps", str(STEPS), "--data", f"movielens:{train}", "--eval-every", str(EVERY), "--log-every", "100"]
    done = _reccompile(
        "train", str(stopping), *common, "--eval-data", f"movielens:{held_out}", "-o", str(tmp_path / "spec")
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["stopped_early"] == one_rank[1]["result"]["stopped_early"]
    assert result["best"] == {k: v for k, v in one_rank[1]["result"]["best"].items() if k != "checkpoint"}
    overridden = _reccompile(
        "train",
        str(stopping),
        *common,
        "--eval-data",
        f"movielens:{held_out}",
        "--best-metric",
        "accuracy",
        "--patience",
        "1",
        "-o",
        str(tmp_path / "flags"),
    )
    assert json.loads(overridden.stdout.splitlines()[-1])["best"]["metric"] == "click.accuracy"
    unused = _reccompile(
        "train", str(stopping), "--data", f"movielens:{train}", "--steps", "2", "-o", str(tmp_path / "none")
    )
    line = f"{stopping}:18:3"  # the early_stopping key
    assert unused.stderr.splitlines()[0] == (
        f"note: training.early_stopping ({line}) is not applied: there is no --eval-data to measure auc on"
    )
    assert "stopped_early" not in json.loads(unused.stdout.splitlines()[-1])
