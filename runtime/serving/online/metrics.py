"""The server's counters in Prometheus's text format (`GET /metrics`).

    reccompile_requests_total{model,code}      infer requests answered, by HTTP status
    reccompile_request_errors_total{model,code} of them, those answered 4xx or 5xx
    reccompile_request_seconds{model}          histogram: from the body read to the answer
    reccompile_batch_rows{model}               histogram: rows per model batch
    reccompile_batch_seconds{model}            histogram: one batch's model call (parse, model, answers)
    reccompile_batch_cpu_seconds{model}        histogram: the CPU time of that call (its thread's): the
                                               call's wall time above it is time the OS ran something else
    reccompile_loop_lag_seconds                histogram: how late the event loop ran a timer (a stall)
    reccompile_gc_seconds                      histogram: the garbage collector's pauses
    reccompile_queue_rows{model}               gauge: rows waiting for a batch
    reccompile_cancelled_total{model}          requests whose client left before their batch ran
    reccompile_reloads_total{model}            exports swapped in without a restart
    reccompile_reload_failures_total{model}    reloads refused (a broken export; the old one kept serving)

Written by hand (a few dozen lines) rather than with prometheus_client: the
format is plain text, and the batcher thread and the event loop share one lock.
The latency buckets are fine below 10 ms, where a served request's p50 and
p99 lie, so that a benchmark can read the server's own quantiles from them
beside its client's (benchmarks/serve_bench.py); the loop lag and the GC
pauses say whether a slow request waited on a stalled event loop.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

__all__ = ["Metrics"]

SECONDS = (
    *(i / 10_000 for i in range(1, 10)),  # 0.1 ms steps up to 1 ms
    *(i / 4_000 for i in range(4, 20)),  # 0.25 ms steps up to 5 ms
    *(i / 1_000 for i in range(5, 11)),  # 1 ms steps up to 10 ms
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.sum, self.count = bounds, [0] * len(bounds), 0.0, 0

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)
        if index < len(self.bounds):
            self.counts[index] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, running, before = [], 0, f"{labels}," if labels else ""
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            out.append(f'{name}_bucket{{{before}le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{{before}le="+Inf"}} {self.count}')
        braced = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{braced} {self.sum:.9g}", f"{name}_count{braced} {self.count}"]
        return out


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = defaultdict(int)
        self._latency: dict[str, _Histogram] = {}
        self._batches: dict[str, _Histogram] = {}
        self._batch_seconds: dict[str, _Histogram] = {}
        self._batch_cpu: dict[str, _Histogram] = {}
        self._loop_lag = _Histogram(SECONDS)
        self._gc = _Histogram(SECONDS)
        self._queue: dict[str, int] = {}
        self._cancelled: dict[str, int] = defaultdict(int)
        self._reloads: dict[str, int] = defaultdict(int)
        self._reload_failures: dict[str, int] = defaultdict(int)

    def request(self, model: str, code: int, seconds: float) -> None:
        with self._lock:
            self._requests[model, code] += 1
            self._latency.setdefault(model, _Histogram(SECONDS)).observe(seconds)

    def batch(self, model: str, rows: int) -> None:
        with self._lock:
            self._batches.setdefault(model, _Histogram(ROWS)).observe(rows)

    def batch_seconds(self, model: str, seconds: float, cpu_seconds: float) -> None:
        with self._lock:
            self._batch_seconds.setdefault(model, _Histogram(SECONDS)).observe(seconds)
            self._batch_cpu.setdefault(model, _Histogram(SECONDS)).observe(cpu_seconds)

    def loop_lag(self, seconds: float) -> None:
        with self._lock:
            self._loop_lag.observe(seconds)

    def gc_pause(self, seconds: float) -> None:
        with self._lock:
            self._gc.observe(seconds)

    def set_queue(self, model: str, rows: int) -> None:
        with self._lock:
            self._queue[model] = rows

    def cancelled(self, model: str, count: int) -> None:
        with self._lock:
            self._cancelled[model] += count

    def reloaded(self, model: str) -> None:
        with self._lock:
            self._reloads[model] += 1

    def reload_failed(self, model: str) -> None:
        with self._lock:
            self._reload_failures[model] += 1

    def text(self) -> str:
        """Every metric in Prometheus's text exposition format."""
        with self._lock:
            out = _header("requests", "counter", "Infer requests answered, by HTTP status.")
            out += [
                f'reccompile_requests_total{{model="{m}",code="{c}"}} {n}'
                for (m, c), n in sorted(self._requests.items())
            ]
            out += _header("request_errors", "counter", "Infer requests answered with a 4xx or 5xx status.")
            out += [
                f'reccompile_request_errors_total{{model="{m}",code="{c}"}} {n}'
                for (m, c), n in sorted(self._requests.items())
                if c >= 400
            ]
            out += _header("request_seconds", "histogram", "Infer request latency, from the body read to the answer.")
            for model, histogram in sorted(self._latency.items()):
                out += histogram.lines("reccompile_request_seconds", f'model="{model}"')
            out += _header("batch_rows", "histogram", "Rows per model batch.")
            for model, histogram in sorted(self._batches.items()):
                out += histogram.lines("reccompile_batch_rows", f'model="{model}"')
            out += _header("batch_seconds", "histogram", "One batch's model call: parsing, the model, the answers.")
            for model, histogram in sorted(self._batch_seconds.items()):
                out += histogram.lines("reccompile_batch_seconds", f'model="{model}"')
            out += _header("batch_cpu_seconds", "histogram", "The CPU time of one batch's model call (its thread's).")
            for model, histogram in sorted(self._batch_cpu.items()):
                out += histogram.lines("reccompile_batch_cpu_seconds", f'model="{model}"')
            out += _header("loop_lag_seconds", "histogram", "How late the event loop ran a periodic timer.")
            out += self._loop_lag.lines("reccompile_loop_lag_seconds", "")
            out += _header("gc_seconds", "histogram", "The garbage collector's pauses.")
            out += self._gc.lines("reccompile_gc_seconds", "")
            out += _header("queue_rows", "gauge", "Rows waiting for a batch.")
            out += [f'reccompile_queue_rows{{model="{m}"}} {n}' for m, n in sorted(self._queue.items())]
            out += _header("cancelled", "counter", "Requests whose client left before their batch ran.")
            out += [f'reccompile_cancelled_total{{model="{m}"}} {n}' for m, n in sorted(self._cancelled.items())]
            out += _header("reloads", "counter", "Exports swapped in without a restart.")
            out += [f'reccompile_reloads_total{{model="{m}"}} {n}' for m, n in sorted(self._reloads.items())]
            out += _header("reload_failures", "counter", "Reloads refused: a broken export; the old one serves on.")
            out += [
                f'reccompile_reload_failures_total{{model="{m}"}} {n}' for m, n in sorted(self._reload_failures.items())
            ]
        return "\n".join(out) + "\n"


def _header(name: str, kind: str, help_text: str) -> list[str]:
    full = f"reccompile_{name}" + ("_total" if kind == "counter" else "")
    return [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
