"""How many torch threads a process gets: the cores free at launch, shared out.

torch's intra-op pool waits for all its threads at every parallel region, so
one thread on a core another process holds stalls every op: on a 2-core
machine with one core busy, two threads train 5-35x slower than one, and the
serving kernels (on the same OpenMP pool) slowed ~60x. `reccompile train`
(per rank), `predict` and `retrieve` (one process, no DataLoader workers)
therefore count the cores this process may run on (`os.sched_getaffinity`),
measure how busy the machine is over a short probe of /proc/stat, and give
each rank an equal share of the free cores after the DataLoader workers
(busy parsing in every file-fed run) take theirs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

PROBE_SECONDS = 0.2


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # per rank, or for the one process when not per_rank
    free: int | None  # cores free at launch; None: not measured (--threads given)
    usable: int  # cores this process may run on
    per_rank: bool = True  # False: one process (predict, retrieve), no ranks to speak of

    def describe(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}" + (" per rank" if self.per_rank else "")
        if self.free is None:
            return f"{threads} (--threads; {self.usable} cores usable)"
        return f"{threads} ({self.free} of {self.usable} cores free)"


def choose_threads(ranks: int, data_workers: int, probe_seconds: float = PROBE_SECONDS) -> ThreadChoice:
    """Threads per rank for `ranks` ranks on this host, each with `data_workers` busy neighbours."""
    usable = len(os.sched_getaffinity(0))
    idle = idle_cpus(probe_seconds)
    free = usable if idle is None else max(1, min(usable, round(idle)))
    return ThreadChoice(max(1, (free - ranks * data_workers) // ranks), free, usable)


def given_threads(threads: int, per_rank: bool = True) -> ThreadChoice:
    """The user's `--threads`, which stands whatever the machine's load."""
    return ThreadChoice(threads, None, len(os.sched_getaffinity(0)), per_rank)


def process_threads(requested: int | None) -> ThreadChoice:
    """Threads for one process without DataLoader workers (predict, retrieve): `--threads` or the free cores."""
    if requested is not None:
        return given_threads(requested, per_rank=False)
    chosen = choose_threads(1, 0)
    return ThreadChoice(chosen.threads, chosen.free, chosen.usable, per_rank=False)


def idle_cpus(seconds: float) -> float | None:
    """CPUs idle over the next `seconds` (from /proc/stat); None where it cannot be read."""
    before = _cpu_times()
    if before is None:
        return None
    time.sleep(seconds)
    after = _cpu_times()
    if after is None:
        return None
    total = sum(after) - sum(before)
    if total <= 0:
        return None
    idle = (after[3] + after[4]) - (before[3] + before[4])  # idle + iowait
    return idle / total * (os.cpu_count() or 1)


def _cpu_times() -> list[int] | None:
    try:
        with open("/proc/stat") as stream:
            fields = stream.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    return [int(x) for x in fields[1:8]]
