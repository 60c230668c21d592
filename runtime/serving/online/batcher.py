"""Dynamic batching: concurrent requests queued and run together, cut at `max_batch` rows or `max_wait`.

    batcher = Batcher(run, max_batch=64, max_wait=0.002, max_queue=1024, metrics=metrics, model="dlrm")
    batcher.start()
    future = batcher.submit(work, rows=1)     # Overloaded when `max_queue` rows already wait
    result = await asyncio.wrap_future(future)
    batcher.stop()                            # runs what is queued, then the thread ends

One thread runs the batches (the model's own intra-op threads do the
arithmetic), so a batch of 64 single-row requests costs one forward instead
of 64. The batch starts when `max_batch` rows are queued or the oldest
request has waited `max_wait` seconds, whichever is first; a request is
never split. `run(works)` returns one result per work, or an exception for a
work that alone failed (a bad value in one request does not fail its batch).
A request whose client went away is cancelled and skipped when its batch is
cut: it costs no model time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from runtime.serving.online.metrics import Metrics

__all__ = ["Batcher", "Overloaded"]


class Overloaded(Exception):
    """The queue is full: the server answers 503 with Retry-After."""


@dataclass
class _Queued:
    work: Any
    rows: int
    arrived: float
    future: Future = field(default_factory=Future)


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
    ) -> None:
        self.run, self.max_batch, self.max_wait, self.max_queue = run, max_batch, max_wait, max_queue
        self.metrics, self.model = metrics, model
        self._queue: deque[_Queued] = deque()
        self._rows = 0
        self._stopping = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{model}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Run every queued request, then end the thread."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join()

    def submit(self, work: Any, rows: int) -> Future:
        with self._ready:
            if self._stopping:
                raise Overloaded("the server is shutting down")
            if self._rows and self._rows + rows > self.max_queue:
                raise Overloaded(f"{self._rows} rows are queued (--max-queue {self.max_queue})")
            queued = _Queued(work, rows, time.perf_counter())
            self._queue.append(queued)
            self._rows += rows
            self.metrics.set_queue(self.model, self._rows)
            self._ready.notify()
        return queued.future

    def _cut(self) -> list[_Queued] | None:
        """The next batch (waiting as the module docstring says); None when stopped and empty."""
        with self._ready:
            while not self._queue and not self._stopping:
                self._ready.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].arrived + self.max_wait
            while self._rows < self.max_batch and not self._stopping:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._ready.wait(left)
            batch: list[_Queued] = []
            rows = 0
            while self._queue and (not batch or rows + self._queue[0].rows <= self.max_batch):
                batch.append(self._queue.popleft())
                rows += batch[-1].rows
            self._rows -= rows
            self.metrics.set_queue(self.model, self._rows)
            return batch

    def _loop(self) -> None:
        while (batch := self._cut()) is not None:
            live = [queued for queued in batch if queued.future.set_running_or_notify_cancel()]
            self.metrics.cancelled(self.model, len(batch) - len(live))
            if not live:
                continue
            self.metrics.batch(self.model, sum(queued.rows for queued in live))
            try:
                results = self.run([queued.work for queued in live])
            except Exception as error:  # the model failed: every request of the batch answers 500
                results = [error] * len(live)
            for queued, result in zip(live, results, strict=True):
                if isinstance(result, BaseException):
                    queued.future.set_exception(result)
                else:
                    queued.future.set_result(result)
