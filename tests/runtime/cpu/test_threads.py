"""runtime/cpu/threads.py: threads per rank (or for one process) from the cores free at launch."""

from __future__ import annotations

import os

import pytest

from runtime.cpu import threads
from runtime.cpu.threads import ThreadChoice, choose_threads, process_threads


@pytest.mark.parametrize(
    ("usable", "idle", "ranks", "data_workers", "expected"),
    [
        (2, 2.0, 1, 0, ThreadChoice(2, 2, 2)),  # an idle 2-core machine: both cores
        (2, 1.1, 1, 0, ThreadChoice(1, 1, 2)),  # another process holds a core: one thread
        (2, 0.2, 1, 0, ThreadChoice(1, 1, 2)),  # a saturated machine: still one
        (8, 8.0, 2, 1, ThreadChoice(3, 8, 8)),  # 2 ranks, each with a DataLoader worker on a core
        (8, 6.6, 2, 0, ThreadChoice(3, 7, 8)),
        (4, 16.0, 1, 0, ThreadChoice(4, 4, 4)),  # more idle CPUs than this process may use
        (4, None, 2, 0, ThreadChoice(2, 4, 4)),  # no /proc/stat: every usable core counts as free
    ],
)
def test_threads_are_the_free_cores_shared_among_ranks(
    monkeypatch: pytest.MonkeyPatch,
    usable: int,
    idle: float | None,
    ranks: int,
    data_workers: int,
    expected: ThreadChoice,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(usable)))
    monkeypatch.setattr(threads, "idle_cpus", lambda seconds: idle)
    assert choose_threads(ranks, data_workers) == expected


def test_the_probe_measures_idle_cpus_on_this_machine() -> None:
    idle = threads.idle_cpus(0.05, windows=2)
    assert idle is not None and 0.0 <= idle <= os.cpu_count()
    assert ThreadChoice(1, 1, 2).describe() == "1 thread per rank (1 of 2 cores free)"
    assert ThreadChoice(3, 7, 8).describe() == "3 threads per rank (7 of 8 cores free)"
    assert ThreadChoice(2, None, 2).describe() == "2 threads per rank (--threads; 2 cores usable)"


@pytest.mark.parametrize(
    ("idle", "requested", "expected"),
    [
        (1.1, None, ThreadChoice(1, 1, 2, per_rank=False)),  # a neighbour holds a core: one thread
        (2.0, None, ThreadChoice(2, 2, 2, per_rank=False)),  # both free: both
        (0.3, 3, ThreadChoice(3, None, 2, per_rank=False)),  # --threads stands, unmeasured
    ],
)
def test_one_process_takes_the_free_cores_unless_told(
    monkeypatch: pytest.MonkeyPatch, idle: float, requested: int | None, expected: ThreadChoice
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads, "idle_cpus", lambda seconds: idle)
    assert process_threads(requested) == expected


def test_one_process_is_described_without_ranks() -> None:
    assert ThreadChoice(1, 1, 2, per_rank=False).describe() == "1 thread (1 of 2 cores free)"
    assert ThreadChoice(2, 2, 2, per_rank=False).describe() == "2 threads (2 of 2 cores free)"
    assert ThreadChoice(3, None, 2, per_rank=False).describe() == "3 threads (--threads; 2 cores usable)"


def _samples(readings: list[tuple[int, int, float]]) -> list[threads.CpuSample]:
    """(busy ticks, idle ticks, own seconds) so far, as /proc/stat's cpu line and os.times would read."""
    return [threads.CpuSample((busy, 0, 0, idle, 0, 0, 0), own) for busy, idle, own in readings]


@pytest.mark.parametrize(
    ("readings", "expected_idle", "expected_free"),
    [
        # 2 CPUs at 100 ticks/s: a window of 0.1 s has 20 ticks
        ([(0, 0, 0.0), (0, 20, 0.0), (0, 40, 0.0), (0, 60, 0.0)], 2.0, 2),  # idle
        ([(0, 0, 0.0), (10, 10, 0.0), (20, 20, 0.0), (30, 30, 0.0)], 1.0, 1),  # a neighbour holds a core
        # the previous benchmark's exit holds a core in the first window only: a burst, not a busy core
        ([(0, 0, 0.0), (10, 10, 0.0), (10, 30, 0.0), (10, 50, 0.0)], 2.0, 2),
        # this process's own threads spin on a core: not another process's
        ([(0, 0, 0.0), (10, 10, 0.1), (20, 20, 0.2), (30, 30, 0.3)], 2.0, 2),
        ([(0, 0, 0.0), (14, 26, 0.0), (28, 52, 0.0)], 1.3, 1),  # 70% of a core held: held
        ([(0, 0, 0.0), (4, 36, 0.0), (8, 72, 0.0)], 1.8, 2),  # 20% of a core held: free
        ([(0, 0, 0.0)], None, 2),  # one reading: unmeasured, every usable core counts
        ([(0, 0, 0.0), (0, 0, 0.0)], None, 2),  # no tick elapsed
    ],
)
def test_free_cores_from_probe_windows(
    readings: list[tuple[int, int, float]], expected_idle: float | None, expected_free: int
) -> None:
    idle = threads.idle_over_windows(_samples(readings), cpus=2, tick_seconds=0.01)
    assert idle == (None if expected_idle is None else pytest.approx(expected_idle))
    assert threads.free_cores(2, idle) == expected_free
