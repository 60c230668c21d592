"""`training.lr_plateau` in `reccompile train`, on the planted MovieLens ratings of the early-stopping tests.

The held-out AUC peaks after about an epoch and falls: every learning rate
must be cut by `factor` after `patience` + 1 passes without a gain, exactly
at the passes torch's ReduceLROnPlateau picks from the logged AUCs; a run
resumed from a checkpoint saved before its step's evaluation trains at the
same rates as the uninterrupted one; without --eval-data it is a one-line error.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from test_train_early_stopping import SPEC, write_ratings

from compiler.cli import main

EVERY, STEPS, BASE_LR = 25, 300, 0.01
PLATEAU = SPEC + "  lr_plateau: {metric: auc, factor: 0.5, patience: 1}\n"


def _reccompile(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def ratings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("movielens")
    spec = directory / "ml_deepfm.yaml"
    spec.write_text(PLATEAU)
    return (spec, *write_ratings(directory))


def _train(ratings: tuple[Path, Path, Path], out: Path, *extra: str) -> None:
    spec, train, held_out = ratings
    code, _, err = _reccompile(
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
        "5",
        "--checkpoint-dir",
        str(out / "ck"),
        "--log-dir",
        str(out / "logs"),
        "-o",
        str(out / "build"),
        *extra,
    )
    assert code == 0, err


def _records(out: Path, kind: str) -> list[dict]:
    lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["kind"] == kind]


@pytest.fixture(scope="module")
def straight(ratings: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("straight")
    _train(ratings, out)
    return out


def test_the_rates_fall_where_torchs_reduce_on_plateau_says(straight: Path) -> None:
    evals = [(r["step"], r["metrics"]["click"]["auc"]) for r in _records(straight, "eval")]
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=BASE_LR)
    reference = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=1)
    expected = {}  # the dense rate of the steps after each evaluation pass
    for step, auc in evals:
        reference.step(auc)
        expected[step] = optimizer.param_groups[0]["lr"]
    rates = {r["step"]: r["lr"] for r in _records(straight, "train")}
    after = {step: rates[step + 5] for step in expected if step + 5 in rates}
    assert after == pytest.approx({step: expected[step] for step in after}, rel=1e-6)
    assert min(after.values()) < BASE_LR  # the AUC did plateau: the test saw a reduction


def test_a_resumed_run_trains_at_the_uninterrupted_runs_rates(
    ratings: tuple[Path, Path, Path], straight: Path, tmp_path: Path
) -> None:
    # Saved at step 150 before that step's final evaluation: the resumed run evaluates it first.
    _train(ratings, tmp_path, "--steps", "150", "--checkpoint-every", str(EVERY))
    _train(ratings, tmp_path, "--resume")
    rates = {r["step"]: r["lr"] for r in _records(straight, "train")}
    resumed = {r["step"]: r["lr"] for r in _records(tmp_path, "train") if r["step"] > 150}
    assert resumed == pytest.approx({step: rates[step] for step in resumed}, rel=1e-6)
    assert len(set(resumed.values())) > 1 or min(resumed.values()) < BASE_LR


def test_without_eval_data_it_is_a_one_line_error(ratings: tuple[Path, Path, Path], tmp_path: Path) -> None:
    spec, train, _ = ratings
    code, _, err = _reccompile(
        "train", str(spec), "--data", f"movielens:{train}", "--steps", "2", "-o", str(tmp_path / "build")
    )
    assert code == 2
    assert err == f"error: training.lr_plateau ({spec}:18:3) needs --eval-data (the split auc is measured on)\n"
