"""What rank 0 shows while it trains: progress lines, a tqdm bar on a terminal, the result line.

Every `--log-every` steps a line is written (step, loss, samples/s, ETA,
each head's metrics), and so is every evaluation. On a terminal a tqdm bar
runs below those lines; when stdout is a file or a pipe there is no bar, only
the lines, so logs stay readable. The run's last line on stdout is its
result, one JSON object (`result`). These lines are the training command's
output, so they are written to stdout, not logged.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Mapping, TextIO

from tqdm import tqdm

Metrics = Mapping[str, Mapping[str, float | None]]


class Console:
    """Step and evaluation lines and, on a terminal, a bar for a run of `total_steps` steps."""

    def __init__(self, total_steps: int, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.total = total_steps
        self.stream = sys.stdout if stream is None else stream
        self.live = self.stream.isatty() if live is None else live
        self._started = time.perf_counter()
        self._steps_seen = 0  # steps run here: a resumed run starts past step 1
        self._bar: tqdm | None = None

    def advance(self, step: int, samples_per_s: float | None) -> None:
        """Step `step` finished: move the bar (terminal only)."""
        self._steps_seen += 1
        if not self.live:
            return
        if self._bar is None:
            self._bar = tqdm(
                total=self.total, initial=step - 1, file=self.stream, unit="step", dynamic_ncols=True, leave=True
            )
        self._bar.set_postfix_str(f"{_rate(samples_per_s)} samples/s", refresh=False)
        self._bar.update(step - self._bar.n)

    def log(
        self,
        step: int,
        loss: float,
        samples_per_s: float | None,
        metrics: Metrics,
        lr: float | None = None,
        window: tuple[int, int] | None = None,
    ) -> None:
        """A progress line: step, loss, the dense learning rate (when given), samples/s, ETA and
        the metrics of the last window; `window` (first, last step) when it is shorter than the
        log interval's (after a resume)."""
        rate = "" if lr is None else f"  lr {lr:.4g}"
        steps = "" if window is None or not metrics else f"  (metrics of steps {window[0]}-{window[1]})"
        self.message(
            f"step {step:>5}/{self.total}  loss {loss:.6f}{rate}  samples/s {_rate(samples_per_s)}  "
            f"ETA {self._eta(step)}{format_metrics(metrics)}{steps}"
        )

    def message(self, line: str) -> None:
        """A line above the bar (or just a line)."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Close the bar, so what follows starts on a fresh line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _eta(self, step: int) -> str:
        elapsed = time.perf_counter() - self._started
        seconds = round(elapsed / max(self._steps_seen, 1) * (self.total - step))
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _rate(samples_per_s: float | None) -> str:
    """A rate for a line: '-' before any step past the warm-up one was timed."""
    return "-" if samples_per_s is None else f"{samples_per_s:,.0f}"


def format_metrics(metrics: Metrics) -> str:
    """`  head: metric value metric value` for every head ('-' when undefined)."""
    parts = []
    for head, values in metrics.items():
        shown = " ".join(f"{name} {'-' if v is None else f'{v:.4f}'}" for name, v in values.items())
        parts.append(f"  {head}: {shown}")
    return "".join(parts)


def say(line: str, stream: TextIO | None = None) -> None:
    """One line of the run's own output (stdout unless `stream`): a resume, a summary, an error."""
    out = sys.stdout if stream is None else stream
    out.write(line + "\n")
    out.flush()


def result(final: Mapping[str, Any], stream: TextIO | None = None) -> None:
    """The run's result: one JSON object, the last line on stdout."""
    say(json.dumps(final), stream)
