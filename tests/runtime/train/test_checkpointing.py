"""runtime/train/checkpointing.py: the worker's checkpoint options, resume, and restarts under torchrun.

The fault-tolerance test runs `reccompile train --nproc 2 --max-restarts 1`,
SIGKILLs rank 1 mid-run, and checks that torchrun's restart resumed from the
last checkpoint and went on with exactly the losses of an uninterrupted run
(compared at full precision from each run's metrics.jsonl).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoint_cases as cc
from compiler.cli import main as reccompile
from runtime.checkpoint.files import latest_checkpoint
from runtime.train import worker
from runtime.train.options import TrainOptions

REPO = Path(__file__).resolve().parents[3]
STEPS = 40  # ~50 ms each at batch 2048: the kill after step 12 comes long before the end
KILL_AFTER = 12
EVERY = 5


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    return cc.compile_modules(tmp_path_factory.mktemp("modules"), (1,))


def run_worker(module: Path, **options: object) -> int:
    return worker.run(TrainOptions(module=str(module), **{"steps": 4, "log_every": 1, **options}))


def test_resume_without_a_checkpoint_is_a_clear_error(modules, tmp_path: Path, capsys) -> None:
    assert run_worker(modules[1], checkpoint_dir=tmp_path, resume=True) == 1
    err = capsys.readouterr().err
    assert err == f"error: rank 0: --resume: no complete checkpoint in {tmp_path}\n"


def test_resume_from_a_directory_that_does_not_exist_creates_nothing(modules, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "typo"
    assert run_worker(modules[1], checkpoint_dir=missing, resume=True) == 1
    assert (
        capsys.readouterr().err == f"error: rank 0: --resume: no complete checkpoint in {missing}: it does not exist\n"
    )
    assert not missing.exists()


def test_a_runs_best_folder_is_refused_as_the_checkpoint_dir_of_a_run_that_would_save_there(
    modules, tmp_path: Path, capsys
) -> None:
    """DIR/best is pruned to the best evaluation by the run in DIR alone: training on into it would
    put newer, not-best checkpoints beside it, which `export --checkpoint DIR/best` takes. Resuming
    it with nothing left to train (to evaluate it) writes nothing and stays allowed."""
    assert run_worker(modules[1], checkpoint_dir=tmp_path / "ck", steps=2) == 0
    best = tmp_path / "ck" / "best"
    shutil.copytree(tmp_path / "ck" / "step_00000002", best / "step_00000002")  # as --best-metric leaves it
    capsys.readouterr()
    assert run_worker(modules[1], checkpoint_dir=best, resume=True, steps=4) == 1
    assert capsys.readouterr().err == (
        f"error: rank 0: --checkpoint-dir {best}: the best evaluation's checkpoint of the run in {tmp_path / 'ck'}, "
        f"which only that run writes (this run's saves would join it, and `export --checkpoint {best}` would take "
        f"the newest); to train on from it, copy it into a directory of its own and resume there: cp -r "
        f"{best / 'step_00000002'} NEWDIR/, then --checkpoint-dir NEWDIR --resume\n"
    )
    assert sorted(p.name for p in best.iterdir()) == [".lock", "step_00000002"]
    assert run_worker(modules[1], checkpoint_dir=best, resume=True, steps=2) == 0
    assert sorted(p.name for p in best.iterdir()) == [".lock", "step_00000002"]
    own = tmp_path / "own"
    shutil.copytree(best / "step_00000002", own / "step_00000002")
    assert run_worker(modules[1], checkpoint_dir=own, resume=True, steps=4) == 0
    assert sorted(p.name for p in own.iterdir()) == [".lock", "step_00000002", "step_00000004"]


def test_a_new_run_refuses_a_directory_with_an_earlier_runs_checkpoints(modules, tmp_path: Path, capsys) -> None:
    assert run_worker(modules[1], checkpoint_dir=tmp_path, checkpoint_every=2, seed=1) == 0
    before = {p.name: (p / "__0_0.distcp").read_bytes() for p in tmp_path.glob("step_*")}
    capsys.readouterr()
    assert run_worker(modules[1], checkpoint_dir=tmp_path, checkpoint_every=1, keep=1, seed=2) == 1
    assert capsys.readouterr().err == (
        f"error: rank 0: {tmp_path} holds the checkpoints of an earlier run (step_00000004 the latest): "
        "continue that run with --resume, or remove them or choose another --checkpoint-dir\n"
    )
    assert {p.name: (p / "__0_0.distcp").read_bytes() for p in tmp_path.glob("step_*")} == before  # untouched


def test_a_resume_with_another_seed_is_refused(modules, tmp_path: Path, capsys) -> None:
    assert run_worker(modules[1], checkpoint_dir=tmp_path, seed=7) == 0
    capsys.readouterr()
    assert run_worker(modules[1], checkpoint_dir=tmp_path, resume=True, steps=6, seed=8) == 1
    assert capsys.readouterr().err == (
        f"error: rank 0: {tmp_path}/step_00000004 was trained with seed 7, this run's is 8: resume with --seed 7 "
        "(the batches of synthetic data and the shuffles follow it)\n"
    )
    assert run_worker(modules[1], checkpoint_dir=tmp_path, resume=True, steps=6, seed=7) == 0


def test_the_worker_saves_resumes_and_refuses_another_spec(modules, tmp_path: Path, capsys) -> None:
    ckpt, logs = tmp_path / "ck", tmp_path / "logs"
    assert run_worker(modules[1], checkpoint_dir=ckpt, checkpoint_every=3, log_dir=logs) == 0
    assert sorted(p.name for p in ckpt.iterdir()) == [".lock", "step_00000003", "step_00000004"]
    capsys.readouterr()
    assert run_worker(modules[1], checkpoint_dir=ckpt, resume=True, steps=6, log_dir=logs) == 0
    out = capsys.readouterr().out
    assert f"resumed from {ckpt}/step_00000004 at step 4 (--resume)\n" in out
    assert re.findall(r"^step +(\d+)/6", out, re.M) == ["5", "6"]
    assert latest_checkpoint(ckpt) == ckpt / "step_00000006"  # saved after the last step
    # The resumed run appends to the log: it keeps steps 1..6 (issue 20, section 3).
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("step")) for r in records] == [
        *[("train", step) for step in range(1, 5)],
        ("final", None),
        ("resume", 4),
        *[("train", step) for step in (5, 6)],
        ("final", None),
    ]

    other_spec = cc.SPEC.replace("lr: 0.05}\n  sparse", "lr: 0.04}\n  sparse")
    other = cc.compile_modules(tmp_path / "other", (1,), other_spec)[1]
    assert run_worker(other, checkpoint_dir=ckpt, resume=True, steps=8) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: rank 0: {ckpt}/step_00000006: written for another spec (sha256 ")
    assert err.endswith("…); pass --allow-spec-change to load it anyway\n") and "Traceback" not in err
    assert run_worker(other, checkpoint_dir=ckpt, resume=True, allow_spec_change=True, steps=8) == 0
    assert "at step 6 (--resume)" in capsys.readouterr().out


def test_resuming_a_finished_run_appends_to_its_log(modules, tmp_path: Path, capsys) -> None:
    """Nothing is left to train, so no step opens the log: it is opened at the run's start all the
    same, and appended to (it was started afresh, the finished run's records lost)."""
    ckpt, logs = tmp_path / "ck", tmp_path / "logs"
    assert run_worker(modules[1], checkpoint_dir=ckpt, log_dir=logs) == 0
    assert run_worker(modules[1], checkpoint_dir=ckpt, resume=True, log_dir=logs) == 0
    assert "note: step 4 is this run's last: nothing is left to train" in capsys.readouterr().out
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("step"), r.get("steps")) for r in records] == [
        *[("train", step, None) for step in range(1, 5)],
        ("final", None, 4),
        ("resume", 4, None),
        ("final", None, 0),
    ]


def test_a_spec_change_that_skips_many_entries_warns_in_one_short_line(modules, tmp_path: Path, capsys) -> None:
    ckpt = tmp_path / "ck"
    assert run_worker(modules[1], checkpoint_dir=ckpt) == 0
    other_spec = cc.SPEC.replace(
        "sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}", "sparse_optimizer: {type: sgd, lr: 0.05}"
    )
    other = cc.compile_modules(tmp_path / "other", (1,), other_spec)[1]
    capsys.readouterr()
    assert run_worker(other, checkpoint_dir=ckpt, resume=True, allow_spec_change=True, steps=5) == 0
    [warning] = capsys.readouterr().err.splitlines()
    assert warning == (
        f"warning: {ckpt}/step_00000004 lacks sparse_arch.a.* optimizer state (another table optimizer's: "
        "momentum1 per row), sparse_arch.b.* optimizer state (another table optimizer's: momentum1 per row), "
        "sparse_arch.c.* optimizer state (another table optimizer's: momentum1 per row) and 2 more: those keep "
        "their fresh values (--allow-spec-change)"
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (["--checkpoint-every", "5"], "error: --checkpoint-every needs --checkpoint-dir\n"),
        (["--resume"], "error: --resume needs --checkpoint-dir\n"),
        (["--checkpoint-dir", "x", "--keep", "0"], "error: --keep must be at least 1, got 0\n"),
        (
            ["--checkpoint-dir", "ck/step_00000010", "--resume"],
            "error: --checkpoint-dir ck/step_00000010 is one checkpoint; give the folder that holds the step_<N> "
            "checkpoints: ck\n",
        ),
    ],
)
def test_checkpoint_options_misused_exit_2(tmp_path: Path, capsys, options, message) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(cc.SPEC)
    assert reccompile(["train", str(spec), *options]) == 2
    assert capsys.readouterr().err == message


def test_a_worker_killed_under_torchrun_restarts_from_the_last_checkpoint(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(cc.SPEC)
    reference = train_under_torchrun(spec, tmp_path / "reference", kill=False)
    killed = train_under_torchrun(spec, tmp_path / "killed", kill=True)

    resumed = re.search(r"^resumed from \S+ at step (\d+) \(torchrun restarted this job\)$", killed.out, re.M)
    assert resumed is not None, killed.out
    at = int(resumed.group(1))
    assert at % EVERY == 0 and EVERY <= at <= KILL_AFTER + 1
    # Before the kill, the lines the two runs printed agree; after it, every loss does, exactly.
    assert printed(killed.out)[:KILL_AFTER] == printed(reference.out)[:KILL_AFTER]
    assert sorted(killed.losses) == list(range(at + 1, STEPS + 1))
    assert {step: reference.losses[step] for step in killed.losses} == killed.losses
    sys.stdout.write(report(reference, killed, at))


class Run:
    def __init__(self, out: str, losses: dict[int, float]) -> None:
        self.out, self.losses = out, losses


def train_under_torchrun(spec: Path, directory: Path, kill: bool) -> Run:
    """`reccompile train` on 2 ranks with restarts; with `kill`, SIGKILL rank 1 after step KILL_AFTER."""
    checkpoints = directory / "checkpoints"
    command = [
        sys.executable,
        "-m",
        "compiler.cli",
        "train",
        str(spec),
        "-o",
        str(directory / "build"),
        "--nproc",
        "2",
        "--max-restarts",
        "1",
        "--steps",
        str(STEPS),
        "--batch-size",
        "2048",
        "--log-every",
        "1",
        "--log-dir",
        str(directory / "log"),
        "--checkpoint-dir",
        str(checkpoints),
        "--checkpoint-every",
        str(EVERY),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    directory.mkdir(parents=True)
    errors = directory / "stderr.txt"
    with open(errors, "w") as stderr:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if kill and line.startswith(f"step {KILL_AFTER:>5}/"):
            os.kill(cc.worker_pids(str(checkpoints))[1], signal.SIGKILL)
            kill = False
    assert process.wait(timeout=300) == 0, "".join(lines) + errors.read_text()
    log = (directory / "log" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in log]
    # A restarted run appends to the log after a resume record: no step is lost.
    assert sorted({r["step"] for r in records if r["kind"] == "train"}) == list(range(1, STEPS + 1))
    resumes = [i for i, r in enumerate(records) if r["kind"] == "resume"]
    after = records[resumes[-1] + 1 :] if resumes else records
    losses = {r["step"]: r["loss"] for r in after if r["kind"] == "train"}
    return Run("".join(lines), losses)


def printed(out: str) -> list[tuple[int, str]]:
    return [(int(s), loss) for s, loss in re.findall(r"^step +(\d+)/\d+ +loss (\S+)", out, re.M)]


def report(reference: Run, killed: Run, at: int) -> str:
    """Both runs' losses, step by step, for the record (pytest -s shows it)."""
    lines = [f"\nrank 1 SIGKILLed after step {KILL_AFTER}; torchrun restarted both ranks from step {at}"]
    lines.append("step  uninterrupted        killed and resumed")
    before = dict(printed(killed.out))
    for step in range(1, STEPS + 1):
        resumed = killed.losses.get(step)
        shown = f"{resumed!r}" if resumed is not None else f"{before.get(step, '-')} (before the kill)"
        lines.append(f"{step:>4}  {reference.losses[step]!r:<20} {shown}")
    return "\n".join(lines) + "\n"
