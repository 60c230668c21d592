"""The batcher runs at once when idle, batches what arrives meanwhile, cuts at max_batch rows or max_wait,
skips cancelled requests, fails only the bad one, and runs big batches off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from runtime.serving.online.batcher import Batcher, Overloaded
from runtime.serving.online.metrics import Metrics


class Recorder:
    """A `run` that records each batch's works and thread, and answers each work doubled, or its exception."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.batches: list[list[object]] = []
        self.threads: list[str] = []
        self.seconds = seconds

    def __call__(self, works: list[object]) -> list[object]:
        time.sleep(self.seconds)
        self.batches.append(list(works))
        self.threads.append(threading.current_thread().name)
        return [ValueError(f"bad {w}") if w == "bad" else 2 * w for w in works]


def _run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(test(), timeout=20))


def _batcher(run: Recorder, **options: float) -> Batcher:
    settings = {"max_batch": 4, "max_wait": 0.0, "max_queue": 100, "inline_rows": 2, **options}
    return Batcher(run, metrics=Metrics(), model="m", **settings)  # type: ignore[arg-type]


def test_an_idle_model_runs_at_once_and_what_arrives_meanwhile_makes_the_next_batch() -> None:
    async def test() -> None:
        run = Recorder(seconds=0.2)
        batcher = _batcher(run, max_batch=8, inline_rows=0)  # every batch on the thread: the loop goes on
        started = time.perf_counter()
        first = batcher.submit(1, rows=1)
        await asyncio.sleep(0.05)  # the first batch is running
        later = [batcher.submit(i, rows=1) for i in (2, 3, 4)]
        assert await first == 2
        assert time.perf_counter() - started < 0.35  # it did not wait for company
        assert await asyncio.gather(*later) == [4, 6, 8]
        assert run.batches == [[1], [2, 3, 4]]
        await batcher.stop()

    _run(test)


def test_a_full_batch_runs_at_once_and_a_lone_request_after_max_wait() -> None:
    async def test() -> None:
        run = Recorder()
        batcher = _batcher(run, max_batch=4, max_wait=5.0)
        futures = [batcher.submit(i, rows=2) for i in range(3)]  # 2 + 2 rows fill a batch; the third waits
        assert await asyncio.gather(*futures[:2]) == [0, 2]  # well before the 5 s wait
        await asyncio.sleep(0.05)
        assert not futures[2].done()
        await batcher.stop()  # runs the queued request without waiting out max_wait
        assert futures[2].result() == 4
        assert run.batches == [[0, 1], [2]]
        lone = _batcher(run, max_wait=0.2)
        started = time.perf_counter()
        assert await lone.submit(10, rows=1) == 20
        assert time.perf_counter() - started >= 0.2
        await lone.stop()

    _run(test)


def test_a_request_is_never_split_and_a_big_one_runs_alone_off_the_loop() -> None:
    async def test() -> None:
        run = Recorder()
        batcher = _batcher(run, max_batch=4, inline_rows=2)
        futures = [batcher.submit(1, rows=3), batcher.submit(2, rows=9), batcher.submit(3, rows=1)]
        assert await asyncio.gather(*futures) == [2, 4, 6]
        assert run.batches == [[1], [2], [3]]
        loop_thread = threading.current_thread().name
        # 3 and 9 rows are over inline_rows: the batcher's thread; 1 row runs on the loop
        assert [name == loop_thread for name in run.threads] == [False, False, True]
        assert run.threads[0].startswith("batcher-m")
        await batcher.stop()

    _run(test)


def test_a_cancelled_request_is_skipped_and_a_bad_one_fails_alone() -> None:
    async def test() -> None:
        run = Recorder()
        batcher = _batcher(run, max_batch=8, max_wait=0.05)
        gone, bad, good = batcher.submit(5, rows=1), batcher.submit("bad", rows=1), batcher.submit(7, rows=1)
        assert gone.cancel()
        assert await good == 14
        with pytest.raises(ValueError, match="bad bad"):
            await bad
        assert run.batches == [["bad", 7]]
        await batcher.stop()

    _run(test)


def test_a_full_queue_is_overloaded_and_stop_runs_what_is_queued() -> None:
    async def test() -> None:
        run = Recorder(seconds=0.2)
        batcher = _batcher(run, max_batch=2, max_wait=10.0, max_queue=3, inline_rows=0)
        first = batcher.submit(1, rows=2)  # a full batch: runs at once, on the thread, for 0.2 s
        await asyncio.sleep(0.05)
        queued = batcher.submit(2, rows=3)
        with pytest.raises(Overloaded, match=r"^3 rows are queued \(--max-queue 3\)$"):
            batcher.submit(3, rows=1)
        started = time.perf_counter()
        await batcher.stop()  # does not wait out the 10 s max_wait
        assert time.perf_counter() - started < 5
        assert (first.result(), queued.result()) == (2, 4)
        with pytest.raises(Overloaded, match=r"^the server is shutting down$"):
            batcher.submit(4, rows=1)

    _run(test)
