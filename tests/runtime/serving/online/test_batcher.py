"""The batcher cuts the queue at max_batch rows or max_wait, skips cancelled requests, fails only the bad one."""

from __future__ import annotations

import threading
import time

import pytest

from runtime.serving.online.batcher import Batcher, Overloaded
from runtime.serving.online.metrics import Metrics


class Recorder:
    """A `run` that records each batch's works and answers each work doubled, or its exception."""

    def __init__(self) -> None:
        self.batches: list[list[object]] = []
        self.gate = threading.Event()

    def __call__(self, works: list[object]) -> list[object]:
        self.gate.wait(timeout=10)
        self.batches.append(list(works))
        return [ValueError(f"bad {w}") if w == "bad" else 2 * w for w in works]


def _batcher(run: Recorder, **options: float) -> Batcher:
    settings = {"max_batch": 4, "max_wait": 0.05, "max_queue": 100, **options}
    batcher = Batcher(run, metrics=Metrics(), model="m", **settings)  # type: ignore[arg-type]
    batcher.start()
    return batcher


def test_a_full_batch_runs_at_once_and_a_lone_request_after_max_wait() -> None:
    run = Recorder()
    run.gate.set()
    batcher = _batcher(run, max_batch=4, max_wait=5.0)
    futures = [batcher.submit(i, rows=2) for i in range(3)]  # 2 + 2 rows fill a batch; the third waits
    assert [f.result(timeout=3) for f in futures[:2]] == [0, 2]  # well before the 5 s wait
    assert not futures[2].done()
    batcher.stop()  # runs the queued request without waiting out max_wait
    assert futures[2].result(timeout=1) == 4
    assert run.batches == [[0, 1], [2]]
    lone = _batcher(run, max_wait=0.2)
    started = time.perf_counter()
    assert lone.submit(10, rows=1).result(timeout=5) == 20
    assert time.perf_counter() - started >= 0.2
    lone.stop()


def test_a_request_is_never_split_and_a_big_one_runs_alone() -> None:
    run = Recorder()
    batcher = _batcher(run, max_batch=4, max_wait=0.01)
    futures = [batcher.submit(1, rows=3), batcher.submit(2, rows=9), batcher.submit(3, rows=1)]
    run.gate.set()
    assert [f.result(timeout=5) for f in futures] == [2, 4, 6]
    assert run.batches == [[1], [2], [3]]
    batcher.stop()


def test_a_cancelled_request_is_skipped_and_a_bad_one_fails_alone() -> None:
    run = Recorder()
    batcher = _batcher(run, max_batch=8, max_wait=0.05)
    gone, bad, good = batcher.submit(5, rows=1), batcher.submit("bad", rows=1), batcher.submit(7, rows=1)
    assert gone.cancel()
    run.gate.set()
    assert good.result(timeout=5) == 14
    with pytest.raises(ValueError, match="bad bad"):
        bad.result(timeout=5)
    assert run.batches == [["bad", 7]]
    batcher.stop()


def test_a_full_queue_is_overloaded_and_stop_runs_what_is_queued() -> None:
    run = Recorder()
    batcher = _batcher(run, max_batch=2, max_wait=10.0, max_queue=3)
    first = batcher.submit(1, rows=2)  # taken by the worker, which waits at the gate
    time.sleep(0.1)
    queued = batcher.submit(2, rows=3)
    with pytest.raises(Overloaded, match=r"^3 rows are queued \(--max-queue 3\)$"):
        batcher.submit(3, rows=1)
    run.gate.set()
    batcher.stop()  # does not wait out the 10 s max_wait
    assert (first.result(timeout=1), queued.result(timeout=1)) == (2, 4)
