"""Training progress on rank 0: a live bar on a terminal, plain lines anywhere else.

Every `--log-every` steps a line is printed (step, loss, samples/s, ETA,
each head's metrics), and so is every evaluation. On a terminal a bar below
those lines is redrawn as steps finish (at most ten times a second); when
stdout is a file or a pipe there is no bar, only the lines, so logs stay
readable.
"""

from __future__ import annotations

import sys
import time
from typing import Mapping, TextIO

Metrics = Mapping[str, Mapping[str, float | None]]
_REDRAW_S = 0.1


class Progress:
    """Step lines and, on a terminal, a live bar for a run of `total_steps` steps."""

    def __init__(self, total_steps: int, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.total = total_steps
        self.stream = sys.stdout if stream is None else stream
        self.live = self.stream.isatty() if live is None else live
        self._started = time.perf_counter()
        self._steps_seen = 0  # steps run here: a resumed run starts past step 1
        self._drawn_at = 0.0
        self._bar = ""
        self._loss: float | None = None

    def advance(self, step: int, samples_per_s: float) -> None:
        """Step `step` finished; redraw the bar (terminal only)."""
        self._steps_seen += 1
        now = time.perf_counter()
        if not self.live or (now - self._drawn_at < _REDRAW_S and step < self.total):
            return
        self._drawn_at = now
        filled = round(24 * step / self.total)
        loss = "" if self._loss is None else f"  loss {self._loss:.4f}"
        self._bar = (
            f"[{'#' * filled}{'.' * (24 - filled)}] {step}/{self.total}  "
            f"{samples_per_s:,.0f} samples/s{loss}  ETA {self._eta(step)}"
        )
        self.stream.write("\r\x1b[2K" + self._bar)
        self.stream.flush()

    def log(self, step: int, loss: float, samples_per_s: float, metrics: Metrics) -> None:
        """A progress line: step, loss, samples/s, ETA and the metrics of the last window."""
        self._loss = loss
        line = (
            f"step {step:>5}/{self.total}  loss {loss:.6f}  samples/s {samples_per_s:,.0f}  "
            f"ETA {self._eta(step)}{format_metrics(metrics)}"
        )
        self.message(line)

    def message(self, line: str) -> None:
        """A line above the bar (or just a line)."""
        if self.live and self._bar:
            self.stream.write("\r\x1b[2K" + line + "\n" + self._bar)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line, so what follows starts on a fresh one."""
        if self.live and self._bar:
            self.stream.write("\n")
            self.stream.flush()
            self._bar = ""

    def _eta(self, step: int) -> str:
        elapsed = time.perf_counter() - self._started
        seconds = round(elapsed / max(self._steps_seen, 1) * (self.total - step))
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_metrics(metrics: Metrics) -> str:
    """`  head: metric value metric value` for every head ('-' when undefined)."""
    parts = []
    for head, values in metrics.items():
        shown = " ".join(f"{name} {'-' if v is None else f'{v:.4f}'}" for name, v in values.items())
        parts.append(f"  {head}: {shown}")
    return "".join(parts)
