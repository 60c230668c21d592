"""Checkpoints keep their layout across the Stateful registry (runtime.checkpoint.states).

The code of commit BEFORE (the last one that saved the schedule, early stopping,
kernel choices, data position and RNG through a parameter each) is taken from
this repository's history and trains a run with every kind of state; today's
code trains the same run. Their checkpoints must hold the same manifest
entries and the same tensors, and today's code must resume from the older
checkpoint to the older run's final weights, bit for bit.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from test_train_early_stopping import SPEC, write_ratings

from compiler.cli import main
from runtime.checkpoint.store import load_model_state

REPO = Path(__file__).resolve().parents[3]
BEFORE = "dc2f1a4cc89bdec280f0cd1862d88e992bc46d82"
STEPS, EVERY = 60, 20
LAYOUT_SPEC = SPEC + (
    "  lr_schedule: {type: cosine, warmup_steps: 5, start_factor: 0.5, total_steps: 60, final_factor: 0.1}\n"
    "  lr_plateau: {metric: auc, factor: 0.5, patience: 0}\n"
)


def _arguments(work: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        str(work / "spec.yaml"),
        "--steps",
        str(steps),
        "--data",
        f"movielens:{work / 'train' / 'u.data'}",
        "--eval-data",
        f"movielens:{work / 'eval' / 'u.data'}",
        "--eval-every",
        str(EVERY),
        "--log-every",
        "10",
        "--best-metric",
        "auc",
        "--checkpoint-dir",
        str(out / "ck"),
        "--checkpoint-every",
        str(EVERY),
        "-o",
        str(out / "build"),
        *extra,
    ]


def _today(arguments: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(arguments)
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`before/` trained by commit BEFORE's code, `today/` by this code: the same run."""
    work = tmp_path_factory.mktemp("layout")
    (work / "spec.yaml").write_text(LAYOUT_SPEC)
    write_ratings(work)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", BEFORE, "compiler", "runtime"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(work / "code", filter="data")
    environment = {**os.environ, "PYTHONPATH": str(work / "code")}
    ran = subprocess.run(
        [sys.executable, "-m", "compiler.cli", *_arguments(work, work / "before", STEPS)],
        cwd=work,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr
    _today(_arguments(work, work / "today", STEPS))
    return work


def _manifest(checkpoint: Path) -> dict:
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    # The data files' hashes differ (DCP's metadata names each save); their names do not.
    manifest["files"] = sorted(manifest["files"])
    return manifest


def test_todays_checkpoints_hold_what_the_older_code_saved(runs: Path) -> None:
    for folder in ("", "best"):
        before = sorted(p.name for p in (runs / "before" / "ck" / folder).glob("step_*"))
        assert before and before == sorted(p.name for p in (runs / "today" / "ck" / folder).glob("step_*"))
        for name in before:
            older, newer = runs / "before" / "ck" / folder / name, runs / "today" / "ck" / folder / name
            assert list(_manifest(newer)) == list(_manifest(older))  # the entries, in their order
            assert _manifest(newer) == _manifest(older)
            old_state, new_state = load_model_state(older), load_model_state(newer)
            assert old_state.keys() == new_state.keys()
            assert all(torch.equal(old_state[key], new_state[key]) for key in old_state), name
    saved = _manifest(runs / "today" / "ck" / f"step_{STEPS:08d}")
    assert {"lr_schedule", "early_stopping", "kernels", "global_batch_size", "seed"} <= set(saved)
    assert "plateau" in saved["lr_schedule"]


def test_todays_code_resumes_an_older_checkpoint_to_the_older_runs_weights(runs: Path, tmp_path: Path) -> None:
    shutil.copytree(runs / "before" / "ck" / f"step_{2 * EVERY:08d}", tmp_path / "ck" / f"step_{2 * EVERY:08d}")
    printed = _today(_arguments(runs, tmp_path, STEPS, "--resume"))
    assert f"resumed from {tmp_path / 'ck' / f'step_{2 * EVERY:08d}'} at step {2 * EVERY} (--resume)" in printed
    older = load_model_state(runs / "before" / "ck" / f"step_{STEPS:08d}")
    resumed = load_model_state(tmp_path / "ck" / f"step_{STEPS:08d}")
    assert all(torch.equal(older[key], resumed[key]) for key in older)
    assert _manifest(tmp_path / "ck" / f"step_{STEPS:08d}") == _manifest(runs / "before" / "ck" / f"step_{STEPS:08d}")
