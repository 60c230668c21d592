"""Running torchrun for `reccompile train`, so that the job always ends with a message.

a rank's error      every failing rank prints `error: rank R: MESSAGE`; each distinct
                    message is shown once when the job ends, torchrun's failure report
                    not at all
a rank's death      a rank killed by a signal (torchrun's "exitcode: -9") becomes one
                    line naming the rank, the signal and the checkpoint to resume from
a peer's death      on the other nodes, gloo's "Connection reset by peer" in a rank's
                    error becomes one line saying a rank elsewhere stopped, with the
                    checkpoint to resume from
Ctrl-C              torchrun (in its own session, so a terminal's Ctrl-C reaches only
                    this process) gets SIGTERM and stops the ranks; exit status 130
SIGTERM             (a scheduler's stop) as Ctrl-C, said so; exit status 143
this process dies   torchrun gets SIGTERM from the kernel (PR_SET_PDEATHSIG), even
                    after a SIGKILL, and stops the ranks (which die with it in turn)
torchrun dies       its ranks die with it (and their DataLoader workers with them); one
                    line names the signal and the checkpoint to resume from
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Iterator

from runtime.checkpoint.files import latest_checkpoint
from runtime.process.lifetime import set_parent_death_signal

_WORKER_ERROR = re.compile(r"^error: rank (\d+): (.*)$")
_TORCHRUN_REPORT = re.compile(r"^(Traceback \(most recent call last\):|=+$|\[W\d{4}|[WEI]\d{4} )")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
# torchrun's log line for each failure of a worker group, also those it restarts after (--max-restarts)
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) ")
# The words of a rank's transport when the other end went away (its process died): gloo's, and the
# same-host shared-memory exchange's (runtime/process/shm_exchange.py).
_PEER_LOST = {
    "gloo": re.compile(r"\[\S*gloo\S*\] (.*?Connection (?:reset|closed) by peer(?: \S+)?)"),
    "shared memory": re.compile(r"ExchangeError: (rank \d+ \(pid \d+\) left the shared-memory exchange)"),
}


def run_torchrun(command: list[str], checkpoint_dir: Path | None = None, threads: int = 1) -> int:
    """Run torchrun, passing output through; its exit status, or 130 when interrupted."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    # torchrun's shared rendezvous store keeps the last attempt's keys, so workers restarted
    # by --max-restarts may connect to their dead predecessors (pytorch/pytorch#135712).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM),
    )
    assert process.stderr is not None
    try:
        report = _pass_through(process.stderr)
        status = process.wait()
    except KeyboardInterrupt as stop:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        process.send_signal(signal.SIGTERM)
        for _ in process.stderr:  # torchrun's report of the stop: nothing the user needs
            pass
        process.wait()
        print(interrupted_message(checkpoint_dir, stop), file=sys.stderr)
        return interrupted_status(stop)
    if status < 0:  # torchrun itself killed: its ranks died with it (PR_SET_PDEATHSIG), whatever they printed
        print(
            f"error: torchrun was killed by {_signal_name(-status)}, and the ranks with it; {_where(checkpoint_dir)}",
            file=sys.stderr,
        )
        return 1
    if status == 0:  # torchrun restarted the ranks (--max-restarts) after any failure, and they finished
        if report.failures or report.errors:
            print(
                f"note: torchrun restarted the ranks {_restarts(report)}; the restarted ranks finished", file=sys.stderr
            )
    elif report.killed is not None:  # the other ranks' errors follow from it
        rank, number = report.killed
        print(f"error: rank {rank} was killed by {_signal_name(number)}; {_where(checkpoint_dir)}", file=sys.stderr)
    else:
        sys.stderr.writelines(_peer_lost(line, checkpoint_dir) for line in report.errors.values())
    return status


def _restarts(report: _Report) -> str:
    """What torchrun restarted the ranks after: `after rank 1 failed (its error)` or `after local rank 1
    was killed by signal 9 (SIGKILL)`, behind `2 times, first ` when it restarted them more than once.

    A rank killed by a signal says nothing itself, and the others then report their lost connection
    to it: torchrun's failure line names it. A rank that failed says why in its own error line."""
    times = f"{len(report.failures)} times, first " if len(report.failures) > 1 else ""
    own = [
        match for line in report.errors.values() if (match := _WORKER_ERROR.match(line)) and _lost_peer(line) is None
    ]
    if report.failures and report.failures[0][1] < 0:
        local_rank, code = report.failures[0]
        return f"{times}after local rank {local_rank} was killed by {_signal_name(-code)}"
    first = own[0] if own else _WORKER_ERROR.match(next(iter(report.errors.values()), ""))
    if first is None:
        local_rank, code = report.failures[0]
        return f"{times}after local rank {local_rank} exited with status {code}"
    return f"{times}after rank {first.group(1)} failed ({first.group(2)})"


def _peer_lost(line: str, checkpoint_dir: Path | None) -> str:
    """A rank's error line; its transport's report of a vanished peer in the words of the job."""
    rank_error, lost = _WORKER_ERROR.match(line), _lost_peer(line)
    if rank_error is None or lost is None:
        return line
    return (
        f"error: rank {rank_error.group(1)}: lost its connection to another rank ({lost}): "
        f"that rank stopped, on this node or another, and its own output says why; {_where(checkpoint_dir)}\n"
    )


def _lost_peer(line: str) -> str | None:
    """`transport: its words` where `line` reports that a rank's peer vanished, else None."""
    for transport, pattern in _PEER_LOST.items():
        if (lost := pattern.search(line)) is not None:
            return f"{transport}: {lost.group(1)}"
    return None


class _Report:
    """What torchrun's stderr said: whether a worker reported an error, which rank a signal killed."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}  # each distinct worker error message -> its first line
        self.killed: tuple[int, int] | None = None  # (rank, signal number) of the first failure
        self.failures: list[tuple[int, int]] = []  # (local rank, exit code) of each failure torchrun logged


def _pass_through(stream: IO[str]) -> _Report:
    report = _Report()
    in_torchrun_report = in_root_cause = False
    rank: int | None = None
    for line in stream:
        if (failed := _FAILED.search(line)) is not None:
            report.failures.append((int(failed.group(2)), int(failed.group(1))))
        match = _WORKER_ERROR.match(line)
        if match:
            report.errors.setdefault(match.group(2), line)
            continue
        in_torchrun_report = in_torchrun_report or bool(_TORCHRUN_REPORT.match(line))
        if not in_torchrun_report and not report.errors:
            sys.stderr.write(line)
        in_root_cause = in_root_cause or line.startswith("Root Cause")
        if not in_root_cause:
            continue
        if (found := _RANK.match(line)) is not None:
            rank = int(found.group(1))
        elif (code := _EXITCODE.match(line)) is not None and rank is not None and report.killed is None:
            if int(code.group(1)) < 0:
                report.killed = (rank, -int(code.group(1)))
    return report


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


class Terminated(KeyboardInterrupt):
    """SIGTERM to `reccompile train`: the job stops as on Ctrl-C (ranks, DataLoader workers, the
    checkpoint to resume from named), where by default the launcher died without a word."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated in the main thread (the caller's handler after)."""

    def terminate(number: int, frame: object) -> None:
        raise Terminated

    before = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def interrupted_message(checkpoint_dir: Path | None, stop: BaseException | None = None) -> str:
    said = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
    return f"{said}: {_where(checkpoint_dir)}"


def interrupted_status(stop: BaseException) -> int:
    """A shell's status for the stop: 128 + the signal's number."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def _where(checkpoint_dir: Path | None) -> str:
    if checkpoint_dir is None:
        return "nothing was saved (no --checkpoint-dir)"
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return f"no checkpoint was saved in {checkpoint_dir} yet"
    return f"the last checkpoint is {latest}: continue with --resume"
