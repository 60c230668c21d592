"""`reccompile train --nproc 2` with `training.lr_plateau` trains at one process's rates.

The evaluation metrics are all-reduced before each rank's plateau sees them
(runtime.reporting.metrics; tests/runtime/train/test_lr_plateau_ranks.py holds
each rank's decisions to one process's), so the run cuts its rates at the
passes one process cuts them, and its checkpoint keeps the same plateau state.
The AUCs agree to 1e-4, not exactly: the ranks sum the gradients in another
order, and the difference grows over the steps (about 2e-5 at step 150).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_early_stopping import REPO, write_ratings
from test_train_lr_plateau import PLATEAU, _reccompile

EVERY, STEPS, BASE_LR = 25, 110, 0.01


def _arguments(work: Path, out: Path) -> list[str]:
    return [
        "train",
        str(work / "spec.yaml"),
        "--steps",
        str(STEPS),
        "--data",
        f"movielens:{work / 'train' / 'u.data'}",
        "--eval-data",
        f"movielens:{work / 'eval' / 'u.data'}",
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
    ]


def _records(out: Path, kind: str) -> list[dict]:
    lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["kind"] == kind]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("plateau_ranks")
    (work / "spec.yaml").write_text(PLATEAU)
    write_ratings(work)
    code, _, err = _reccompile(*_arguments(work, work / "one"))
    assert code == 0, err
    done = subprocess.run(
        [sys.executable, "-m", "compiler.cli", *_arguments(work, work / "two"), "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    return work


def test_two_ranks_cut_the_rates_at_one_process_passes(runs: Path) -> None:
    one = {r["step"]: r["metrics"]["click"]["auc"] for r in _records(runs / "one", "eval")}
    two = {r["step"]: r["metrics"]["click"]["auc"] for r in _records(runs / "two", "eval")}
    assert two == pytest.approx(one, abs=1e-4)
    rates = {r["step"]: r["lr"] for r in _records(runs / "one", "train")}
    assert {r["step"]: r["lr"] for r in _records(runs / "two", "train")} == pytest.approx(rates, rel=1e-6)
    assert min(rates.values()) < BASE_LR  # the plateau did cut (a constant schedule): the test saw a decision
    one_saved = json.loads((runs / "one" / "ck" / f"step_{STEPS:08d}" / "manifest.json").read_text())["lr_schedule"]
    two_saved = json.loads((runs / "two" / "ck" / f"step_{STEPS:08d}" / "manifest.json").read_text())["lr_schedule"]
    assert two_saved["plateau"].pop("best") == pytest.approx(one_saved["plateau"].pop("best"), abs=1e-4)
    assert two_saved == one_saved
