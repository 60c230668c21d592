"""`training.lr_plateau` at two ranks takes one process's decisions on the global batch.

The evaluation metrics are all-reduced before the plateau sees them
(runtime.reporting.metrics), so both ranks cut every rate at the same
passes: the logged rates are one process's, and so are the final weights,
whose tables each rank updates at its own rates (a rank that cut at another
pass would leave its tables apart from one process's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train_early_stopping import REPO, write_ratings
from test_train_lr_plateau import PLATEAU, _reccompile

from runtime.checkpoint.store import load_model_state

EVERY, STEPS, BASE_LR = 25, 150, 0.01


def _arguments(work: Path, out: Path) -> list[str]:
    return [
        "train", str(work / "spec.yaml"), "--steps", str(STEPS), "--data", f"movielens:{work / 'train' / 'u.data'}",
        "--eval-data", f"movielens:{work / 'eval' / 'u.data'}", "--eval-every", str(EVERY), "--log-every", "5",
        "--checkpoint-dir", str(out / "ck"), "--log-dir", str(out / "logs"), "-o", str(out / "build"),
    ]  # fmt: skip


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
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return work


def test_two_ranks_cut_the_rates_at_one_process_passes(runs: Path) -> None:
    one = {r["step"]: r["metrics"]["click"]["auc"] for r in _records(runs / "one", "eval")}
    two = {r["step"]: r["metrics"]["click"]["auc"] for r in _records(runs / "two", "eval")}
    assert two == pytest.approx(one, abs=2e-6)
    rates = {r["step"]: r["lr"] for r in _records(runs / "one", "train")}
    assert {r["step"]: r["lr"] for r in _records(runs / "two", "train")} == pytest.approx(rates, rel=1e-6)
    assert min(rates.values()) < BASE_LR  # the plateau did cut (a constant schedule): the test saw a decision
    one_saved = json.loads((runs / "one" / "ck" / f"step_{STEPS:08d}" / "manifest.json").read_text())
    two_saved = json.loads((runs / "two" / "ck" / f"step_{STEPS:08d}" / "manifest.json").read_text())
    assert two_saved["lr_schedule"]["plateau"]["scale"] == one_saved["lr_schedule"]["plateau"]["scale"] < 1.0


def test_both_ranks_trained_their_tables_at_one_process_rates(runs: Path) -> None:
    one = load_model_state(runs / "one" / "ck")
    two = load_model_state(runs / "two" / "ck")
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], atol=1e-4, rtol=1e-4, msg=key)
