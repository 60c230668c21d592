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

The probe is the median of a few short windows, not one window (nor the load
average, which lags by a minute and still counts a benchmark that has just
ended): a burst in one window (a process starting or exiting) is not a busy
core, so it no longer sends a run onto one thread of two. This process's own
CPU time in the probe (its own threads) counts as free: the question is which
cores other processes hold.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

PROBE_SECONDS = 0.2
PROBE_WINDOWS = 5


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
    free = free_cores(usable, idle_cpus(probe_seconds))
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


def free_cores(usable: int, idle: float | None) -> int:
    """Cores free for this process: the idle CPUs rounded (a core half held by another process
    counts as held), at least one, at most the usable ones; all usable when unmeasured."""
    return usable if idle is None else max(1, min(usable, round(idle)))


@dataclass(frozen=True)
class CpuSample:
    """One reading: /proc/stat's first `cpu` line (user nice system idle iowait irq softirq, in
    clock ticks) and this process's own CPU seconds at the same moment."""

    ticks: tuple[int, ...]
    own_seconds: float


def idle_over_windows(samples: Sequence[CpuSample], cpus: int, tick_seconds: float) -> float | None:
    """CPUs not held by other processes: per window between consecutive samples, idle plus this
    process's own share, times `cpus`; the median over windows (a burst in one window is not a
    busy core). None with fewer than two samples or no ticks elapsed."""
    shares = []
    for before, after in itertools.pairwise(samples):
        total = sum(after.ticks) - sum(before.ticks)
        if total <= 0:
            continue
        idle = (after.ticks[3] + after.ticks[4]) - (before.ticks[3] + before.ticks[4])  # idle + iowait
        own = (after.own_seconds - before.own_seconds) / tick_seconds
        shares.append(min(1.0, (idle + own) / total) * cpus)
    return statistics.median(shares) if shares else None


def idle_cpus(seconds: float, windows: int = PROBE_WINDOWS) -> float | None:
    """CPUs idle (or this process's own) over the next `seconds`, from /proc/stat; None where it
    cannot be read."""
    samples = []
    for index in range(windows + 1):
        if index:
            time.sleep(seconds / windows)
        sample = cpu_sample()
        if sample is None:
            return None
        samples.append(sample)
    return idle_over_windows(samples, os.cpu_count() or 1, 1.0 / os.sysconf("SC_CLK_TCK"))


def cpu_sample() -> CpuSample | None:
    """/proc/stat's CPU times and this process's own now; None where /proc/stat cannot be read."""
    ticks = _cpu_times()
    if ticks is None:
        return None
    own = os.times()
    return CpuSample(tuple(ticks), own.user + own.system)


def _cpu_times() -> list[int] | None:
    try:
        with open("/proc/stat") as stream:
            fields = stream.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    return [int(x) for x in fields[1:8]]
