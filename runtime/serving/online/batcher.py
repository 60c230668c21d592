"""Dynamic batching on the event loop: concurrent requests queued and run together, cut at `max_batch` rows.

    batcher = Batcher(run, max_batch=64, max_wait=0.0, max_queue=1024, metrics=metrics, model="dlrm")
    result = await batcher.submit(work, rows=1)   # Overloaded when `max_queue` rows already wait
    await batcher.stop()                          # runs what is queued, then returns

With `max_wait` 0 (the default) nothing waits on purpose: a request that
finds the model idle runs at the loop's next turn, together with whatever
requests the same turn read from the sockets; requests that arrive while a
batch runs form the next one. So a lone client is never delayed and a busy
server batches as deep as its load makes it, each batch costing one model
call instead of one per request. With `max_wait` T > 0 the first request of
a batch waits up to T for company (a batch of `max_batch` rows starts at
once). A request is never split.

Where a batch runs was decided by measurement (README "Serving online"):
a batch of at most `inline_rows` rows runs on the event loop itself, since
for a few rows handing it to a thread and back (two wake-ups, the GIL passed
twice) costs more than the model; a bigger batch runs on the batcher's one
thread so the loop goes on reading requests while the model's kernels,
which release the GIL, compute (`reccompile serve` confined to one core runs
every batch inline: there is nothing to overlap). `run(works)` returns one result per work, or
an exception for a work that alone failed (a bad value in one request does
not fail its batch). A request whose client went away is cancelled and
skipped when its batch is cut: it costs no model time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from runtime.serving.online.metrics import Metrics

__all__ = ["INLINE_ROWS", "Batcher", "Overloaded"]

INLINE_ROWS = 16  # batches of at most this many rows run on the event loop (see the module docstring)


class Overloaded(Exception):
    """The queue is full: the server answers 503 with Retry-After."""


@dataclass
class _Queued:
    work: Any
    rows: int
    arrived: float
    future: asyncio.Future


class Batcher:
    def __init__(
        self,
        run: Callable[[Sequence[Any]], list[Any]],
        *,
        max_batch: int,
        max_wait: float,
        max_queue: int,
        metrics: Metrics,
        model: str,
        inline_rows: int = INLINE_ROWS,
    ) -> None:
        self.run, self.max_batch, self.max_wait, self.max_queue = run, max_batch, max_wait, max_queue
        self.metrics, self.model, self.inline_rows = metrics, model, inline_rows
        self._queue: deque[_Queued] = deque()
        self._rows = 0
        self._stopping = False
        self._busy = False  # a batch is running (on the loop or the thread)
        self._scheduled: asyncio.Handle | None = None  # the next _start: a timer, or soon
        self._soon = False  # _scheduled runs at the loop's next turn
        self._idle: asyncio.Event | None = None
        self._thread: ThreadPoolExecutor | None = None

    def submit(self, work: Any, rows: int) -> asyncio.Future:
        """The request's future (on the running loop); Overloaded when the queue is full or stopping."""
        if self._stopping:
            raise Overloaded("the server is shutting down")
        if self._rows and self._rows + rows > self.max_queue:
            raise Overloaded(f"{self._rows} rows are queued (--max-queue {self.max_queue})")
        loop = asyncio.get_running_loop()
        queued = _Queued(work, rows, loop.time(), loop.create_future())
        self._queue.append(queued)
        self._rows += rows
        self.metrics.set_queue(self.model, self._rows)
        self._schedule(loop)
        return queued.future

    async def stop(self) -> None:
        """Run every queued request without waiting out `max_wait`, then return."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        while self._queue or self._busy:
            self._schedule(loop)
            self._idle = asyncio.Event()
            await self._idle.wait()
        if self._thread is not None:
            self._thread.shutdown()

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Arrange the next batch: at the loop's next turn, or when the oldest request's wait is over."""
        if self._busy or not self._queue:
            return
        due = self._queue[0].arrived + self.max_wait
        if self._stopping or self._rows >= self.max_batch or due <= loop.time():
            if not self._soon:
                if self._scheduled is not None:
                    self._scheduled.cancel()
                self._scheduled, self._soon = loop.call_soon(self._start, loop), True
        elif self._scheduled is None:
            self._scheduled = loop.call_at(due, self._start, loop)

    def _cut(self) -> list[_Queued]:
        batch: list[_Queued] = []
        rows = 0
        while self._queue and (not batch or rows + self._queue[0].rows <= self.max_batch):
            queued = self._queue.popleft()
            rows += queued.rows
            batch.append(queued)
        self._rows -= rows
        self.metrics.set_queue(self.model, self._rows)
        live = [queued for queued in batch if not queued.future.done()]  # done: cancelled, its client gone
        self.metrics.cancelled(self.model, len(batch) - len(live))
        return live

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled, self._soon = None, False
        live = self._cut()
        if not live:
            self._after(loop)
            return
        rows = sum(queued.rows for queued in live)
        self.metrics.batch(self.model, rows)
        works = [queued.work for queued in live]
        if rows <= self.inline_rows:
            self._finish(live, self._results(works))
            self._after(loop)
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"batcher-{self.model}")
        self._busy = True
        done = loop.run_in_executor(self._thread, self._results, works)

        def finished(results: asyncio.Future) -> None:
            self._finish(live, results.result())
            self._after(loop)

        done.add_done_callback(finished)

    def _results(self, works: list[Any]) -> list[Any]:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.run(works)
        except Exception as error:  # the model failed: every request of the batch answers 500
            return [error] * len(works)
        finally:
            self.metrics.batch_seconds(self.model, time.perf_counter() - started, time.thread_time() - cpu)

    @staticmethod
    def _finish(live: list[_Queued], results: list[Any]) -> None:
        for queued, result in zip(live, results, strict=True):
            if queued.future.done():  # its client went away while the batch ran
                continue
            if isinstance(result, BaseException):
                queued.future.set_exception(result)
            else:
                queued.future.set_result(result)

    def _after(self, loop: asyncio.AbstractEventLoop) -> None:
        self._busy = False
        self._schedule(loop)
        if self._idle is not None and not self._queue:
            self._idle.set()
