"""`reccompile train` under signals: Ctrl-C, a rank killed, the launcher killed.

Each job trains the checkpoint tests' tiny spec with a checkpoint every 5
steps and is stopped once it has printed step 12 (a checkpoint exists):
Ctrl-C (SIGINT to the launcher) ends it with exit status 130 and the last
checkpoint named, at 1 and 2 ranks, SIGTERM likewise with 143; a rank killed by SIGKILL ends it with
one line naming the rank, the signal and the checkpoint; a SIGKILLed
launcher takes torchrun and the ranks with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime" / "checkpoint"))
import checkpoint_cases as cc  # noqa: E402
from runtime.checkpoint.files import latest_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
STOP_AFTER = 12


def start(tmp_path: Path, nproc: int) -> tuple[subprocess.Popen, Path]:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(cc.SPEC)
    checkpoints = tmp_path / "ck"
    command = [
        sys.executable,
        "-m",
        "compiler.cli",
        "train",
        str(spec),
        "-o",
        str(tmp_path / "build"),
        "--nproc",
        str(nproc),
        "--steps",
        "100000",
        "--batch-size",
        "256",
        "--log-every",
        "1",
        "--checkpoint-dir",
        str(checkpoints),
        "--checkpoint-every",
        "5",
    ]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        # A suite started in the background (`make test &`) ignores SIGINT, and so would the job, as
        # a Ctrl-C in a terminal never is: the job starts with SIGINT's default, as from a shell prompt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(f"step {STOP_AFTER:>5}/"):
            return process, checkpoints
    raise AssertionError(process.stderr.read() if process.stderr else "no output")


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=120)
    return process.returncode, err


def alive(pids: list[int]) -> list[int]:
    """The processes of `pids` that still run (zombies count as gone)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


def wait_gone(pids: list[int], seconds: float = 60.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


@pytest.mark.parametrize(
    "nproc, number, status_said",
    [
        (1, signal.SIGINT, (130, "interrupted")),
        (2, signal.SIGINT, (130, "interrupted")),
        (2, signal.SIGTERM, (143, "terminated (SIGTERM)")),  # a scheduler's stop
    ],
)
def test_ctrl_c_or_sigterm_stops_the_job_names_the_last_checkpoint_and_exits_128_plus_the_signal(
    tmp_path: Path, nproc: int, number: int, status_said: tuple[int, str]
) -> None:
    process, checkpoints = start(tmp_path, nproc)
    ranks = list(cc.worker_pids(str(checkpoints), nproc).values()) if nproc > 1 else []
    process.send_signal(number)
    status, err = finish(process)
    latest = latest_checkpoint(checkpoints)
    assert latest is not None
    code, said = status_said
    assert (status, err.splitlines()[-1]) == (code, f"{said}: the last checkpoint is {latest}: continue with --resume")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert wait_gone(ranks) == []


def test_a_rank_killed_by_a_signal_is_one_line_naming_the_checkpoint(tmp_path: Path) -> None:
    process, checkpoints = start(tmp_path, 2)
    os.kill(cc.worker_pids(str(checkpoints))[1], signal.SIGKILL)
    status, err = finish(process)
    latest = latest_checkpoint(checkpoints)
    assert latest is not None and status == 1
    assert err.splitlines()[-1] == (
        f"error: rank 1 was killed by signal 9 (SIGKILL); the last checkpoint is {latest}: continue with --resume"
    )
    assert "Traceback" not in err and "ChildFailedError" not in err and "error: rank 0" not in err, err


def test_the_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    process, checkpoints = start(tmp_path, 2)
    ranks = list(cc.worker_pids(str(checkpoints)).values())
    torchrun = [int(p) for p in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]
    process.kill()
    process.communicate(timeout=60)
    assert wait_gone(ranks + torchrun) == []
    saved = latest_checkpoint(checkpoints)
    time.sleep(2)
    assert latest_checkpoint(checkpoints) == saved  # nobody writes there any more
