"""How many torch threads each rank gets: the cores free at launch, shared out.

torch's intra-op pool waits for all its threads at every parallel region, so
one thread on a core another process holds stalls every op: on a 2-core
machine with one core busy, two threads train 5-35x slower than one. The
launcher therefore counts the cores this process may run on
(`os.sched_getaffinity`), measures how busy the machine is over a short
probe of /proc/stat, and gives each rank an equal share of the free cores
after the DataLoader workers (busy parsing in every file-fed run) take theirs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

PROBE_SECONDS = 0.2


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # per rank
    free: int | None  # cores free at launch; None: not measured (--threads given)
    usable: int  # cores this process may run on

    def describe(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''} per rank"
        if self.free is None:
            return f"{threads} (--threads; {self.usable} cores usable)"
        return f"{threads} ({self.free} of {self.usable} cores free)"


def choose_threads(ranks: int, data_workers: int, probe_seconds: float = PROBE_SECONDS) -> ThreadChoice:
    """Threads per rank for `ranks` ranks on this host, each with `data_workers` busy neighbours."""
    usable = len(os.sched_getaffinity(0))
    idle = idle_cpus(probe_seconds)
    free = usable if idle is None else max(1, min(usable, round(idle)))
    return ThreadChoice(max(1, (free - ranks * data_workers) // ranks), free, usable)


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
