"""What can hold a request up on the server beside its own work: a stalled event loop, the GC.

    task = loop.create_task(watch_loop(metrics))   # how late a periodic timer runs: the loop's stalls
    with timing_gc(metrics): ...                    # each garbage collection's pause, while serving

Every request of a server waits for whatever the event loop runs before it:
a batch run inline, a slow callback, a collection of the garbage collector.
A client's p99 mixes those with its own machine's and the network's delays;
these two histograms (runtime.serving.online.metrics) are the server's side,
so a benchmark can tell a tail of ours from one of the load generator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator

from runtime.serving.online.metrics import Metrics

__all__ = ["LAG_EVERY_SECONDS", "timing_gc", "watch_loop"]

LAG_EVERY_SECONDS = 0.01  # often enough to see a stall of a few ms, 100 wake-ups a second at most


async def watch_loop(metrics: Metrics, every: float = LAG_EVERY_SECONDS) -> None:
    """Sleep `every` seconds again and again, recording how much later than asked each wake-up came."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + every
        await asyncio.sleep(every)
        metrics.loop_lag(max(0.0, loop.time() - asked))


@contextlib.contextmanager
def timing_gc(metrics: Metrics) -> Iterator[None]:
    """Record every garbage collection's pause while inside the block."""
    started: list[float] = []

    def callback(phase: str, _: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            metrics.gc_pause(time.perf_counter() - started.pop())

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.callbacks.remove(callback)
