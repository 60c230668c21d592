"""`reccompile train --nproc 2`: torchrun workers on gloo, equal to one process, failing cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime.train.options import TrainOptions

REPO = Path(__file__).resolve().parents[3]


def _reccompile(*args: str, cwd: Path = REPO, tmpdir: Path | None = None) -> subprocess.CompletedProcess:
    temporary = {} if tmpdir is None else {"TMPDIR": str(tmpdir)}
    return subprocess.run(
        [sys.executable, "-m", "compiler.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **temporary},
    )


def _launch(fake_torchrun: str) -> subprocess.CompletedProcess:
    """`run_torchrun` on a stand-in for torchrun: Python code that prints what torchrun would."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from compiler.commands.train import run_torchrun; sys.exit(run_torchrun(sys.argv[1:]))",
            sys.executable,
            "-c",
            fake_torchrun,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )


def _step_losses(stdout: str) -> list[float]:
    return [float(line.split()[3]) for line in stdout.splitlines() if line.startswith("step ")]


def test_dlrm_trains_on_two_ranks_and_leaves_no_torchrun_folders(tmp_path: Path) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    done = _reccompile(
        "train",
        "specs/dlrm_criteo.yaml",
        "--nproc",
        "2",
        "--steps",
        "20",
        "--batch-size",
        "256",
        "-o",
        str(tmp_path / "out"),
        tmpdir=temporary,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["steps"] == 20
    # torchrun's log folders went with the job (torch itself keeps one empty torchinductor_<user>)
    assert [p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_one_and_two_ranks_print_the_same_losses(tmp_path: Path) -> None:
    runs = {}
    for nproc in ("1", "2"):
        done = _reccompile(
            "train",
            "specs/two_tower_movielens.yaml",
            "--nproc",
            nproc,
            "--steps",
            "8",
            "--batch-size",
            "128",
            "--log-every",
            "1",
            "-o",
            str(tmp_path / nproc),
        )
        assert done.returncode == 0, done.stderr
        runs[nproc] = _step_losses(done.stdout)
    assert len(runs["1"]) == 8
    for one, two in zip(runs["1"], runs["2"]):
        assert abs(one - two) <= 1e-5 * abs(one), (runs["1"], runs["2"])


def test_a_failing_worker_ends_the_job_with_its_error_once(tmp_path: Path) -> None:
    compiled = _reccompile("specs/two_tower_movielens.yaml", "-o", str(tmp_path))  # planned for 1 rank
    assert compiled.returncode == 0, compiled.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from compiler.commands.train import run_torchrun; sys.exit(run_torchrun(sys.argv[1:]))",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "runtime.train.worker",
            TrainOptions(module=str(tmp_path / "two_tower_movielens.py"), steps=2).to_json(),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode != 0
    message = "the plan is for world size 1 but this job has 2 ranks: recompile with --world-size 2"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].endswith(message), done.stderr


def test_a_job_that_recovered_ends_with_a_note_not_an_error(tmp_path: Path) -> None:
    """With --max-restarts, torchrun restarts the ranks after a failure; when they finish, the job
    succeeded: the first attempt's error is a note, not an 'error:' asking to resume."""
    fake_torchrun = (
        "import sys; print('error: rank 1: lost its way', file=sys.stderr); print('after the restart', file=sys.stderr)"
    )
    done = _launch(fake_torchrun)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "note: torchrun restarted the ranks after rank 1 failed (lost its way); the restarted ranks finished"
    )
    assert not any(line.startswith("error:") for line in done.stderr.splitlines())


def test_a_recovered_job_names_the_rank_a_signal_killed_not_the_one_that_lost_it(tmp_path: Path) -> None:
    """A SIGKILLed rank prints nothing; its peer reports the lost connection; torchrun logs which
    local rank failed and how (the lines below are torch 2.13's, from a real restart)."""
    fake_torchrun = (
        "import sys; err = sys.stderr.write; "
        "err('error: rank 0: pipeline stage \\'input_dist\\' failed on batch 15: RuntimeError: "
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
        "[127.0.0.1]:17815: Connection reset by peer. This is typically caused by a remote worker\\n'); "
        "err('W1125 09:12:23.558000 8428 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
        "8433 closing signal SIGTERM\\n'); "
        "err('E1125 09:12:23.625000 8428 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
        "(exitcode: -9) local_rank: 1 (pid: 8434) of binary: /usr/bin/python\\n')"
    )
    done = _launch(fake_torchrun)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "note: torchrun restarted the ranks after local rank 1 was killed by signal 9 (SIGKILL); "
        "the restarted ranks finished"
    )


MATRIX_FACTORISATION = """\
version: 1
name: mf
features:
  sparse:
    - {name: user, num_embeddings: 50, dim: 8}
    - {name: item, num_embeddings: 40, dim: 8}
model:
  score: {type: dot_product, input: [sparse.user, sparse.item]}
heads:
  - {name: click, input: score, loss: bce}
training:
  batch_size: 32
  dense_optimizer: {type: adamw, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
"""


def test_a_model_of_tables_alone_trains_on_one_and_two_ranks_alike(tmp_path: Path) -> None:
    """Matrix factorisation has no dense parameter: its dense optimizer steps an empty group (torch
    refuses an empty list) and two ranks need no DDP (which refuses a model without one)."""
    spec = tmp_path / "mf.yaml"
    spec.write_text(MATRIX_FACTORISATION)
    runs = {}
    for nproc in ("1", "2"):
        args = ("train", str(spec), "--nproc", nproc, "--steps", "6", "--log-every", "1", "-o", str(tmp_path / nproc))
        done = _reccompile(*args)
        assert done.returncode == 0, done.stderr
        runs[nproc] = _step_losses(done.stdout)
    assert len(runs["1"]) == 6 and runs["1"][-1] < runs["1"][0]  # the tables learn
    for one, two in zip(runs["1"], runs["2"], strict=True):
        assert abs(one - two) <= 1e-5 * abs(one), (runs["1"], runs["2"])
