"""`--log-dir DIR`: a run's metrics as JSON lines, TensorBoard events, and a plot at the end.

    DIR/metrics.jsonl     one object per line, written as the run goes:
                          {"kind": "train", "step", "loss", "samples_per_s", "metrics": {head: {metric: value}}}
                          ("samples_per_s": null at step 1: the warm-up step is not timed)
                          (+ "lr", "lr_scale": the dense optimizer's learning rate in that step and
                          the schedule's factor of every optimizer's rate, when the run has a schedule;
                          + "metrics_steps": [first, last], when the metrics cover fewer steps than
                          the log interval: the first log step after a resume)
                          {"kind": "eval", "step", "metrics": {...}}  (+ "unseen_ids": {feature: count})
                          {"kind": "resume", "step"}   a resumed run goes on from here (see below)
                          {"kind": "stop", "step", "reason"}   training stopped early (--patience)
                          {"kind": "final", ...the run's final JSON line}
    DIR/events.out.tfevents.*   the same scalars for TensorBoard (`pip install 'reccompile[logs]'`)
    DIR/metrics.png       the loss, the learning rate, then every head's metrics (train and eval),
                          against the step
                          (matplotlib: `pip install 'reccompile[plots]'`)

A run that starts from a checkpoint (`--resume`, or a restart by torchrun)
appends to metrics.jsonl: a `resume` record, then its own records. Steps past
the checkpoint that an interrupted run had logged are logged again by the
resumed one; readers (the plot, `history`) take each step's latest record, and
TensorBoard's events past the checkpoint are purged. A run from step 0
starts the files afresh. Without tensorboard or matplotlib installed, that is
said once and the JSON lines are still written. Written by rank 0 only.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

Metrics = Mapping[str, Mapping[str, float | None]]
Record = dict[str, Any]

logger = logging.getLogger(__name__)


class RunLog:
    """Records to DIR/metrics.jsonl and TensorBoard from `begin(start_step)` on; `close()` plots."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.jsonl = self.directory / "metrics.jsonl"
        self.png = self.directory / "metrics.png"
        self._stream: Any = None
        self._writer: Any = None

    def begin(self, start_step: int) -> None:
        """Open the files for a run going on from `start_step` (0: a fresh run)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        resumed = start_step > 0 and self.jsonl.exists()
        self._stream = open(self.jsonl, "a" if resumed else "w")
        self._writer = _summary_writer(self.directory, purge_step=start_step + 1 if resumed else None)
        if resumed:
            self._write({"kind": "resume", "step": start_step})

    def train(
        self,
        step: int,
        loss: float,
        samples_per_s: float | None,
        metrics: Metrics,
        lr: float | None = None,
        lr_scale: float | None = None,
        window: tuple[int, int] | None = None,
    ) -> None:
        """A log step; `lr` and `lr_scale` (the dense rate, the schedule's factor) when scheduled;
        `window`, the metrics' first and last step, when shorter than the log interval (after a resume)."""
        rates = {key: value for key, value in (("lr", lr), ("lr_scale", lr_scale)) if value is not None}
        steps = {"metrics_steps": list(window)} if window is not None else {}
        self._write(
            {
                "kind": "train",
                "step": step,
                "loss": loss,
                **rates,
                "samples_per_s": None if samples_per_s is None else round(samples_per_s, 1),
                "metrics": metrics,
                **steps,
            }
        )
        if self._writer is not None:
            self._writer.add_scalar("train/loss", loss, step)
            if samples_per_s is not None:
                self._writer.add_scalar("train/samples_per_s", samples_per_s, step)
            for key, value in rates.items():
                self._writer.add_scalar(f"train/{key}", value, step)
            _add_metrics(self._writer, "train", step, metrics)

    def eval(self, step: int, metrics: Metrics, unseen_ids: Mapping[str, int] | None = None) -> None:
        """An evaluation pass; `unseen_ids`: its ids outside the training vocabulary, per feature."""
        extra = {} if unseen_ids is None else {"unseen_ids": dict(unseen_ids)}
        self._write({"kind": "eval", "step": step, "metrics": metrics, **extra})
        if self._writer is not None:
            _add_metrics(self._writer, "eval", step, metrics)

    def stop(self, step: int, reason: str) -> None:
        """Training stopped early after `step`, for `reason` (runtime.train.early_stopping)."""
        self._write({"kind": "stop", "step": step, "reason": reason})

    def close(self, final: Mapping[str, Any]) -> None:
        """Write the final record, close the files, and draw the plot of the whole history."""
        if self._stream is None:
            self.begin(0)
        self._write({"kind": "final", **final})
        self._stream.close()
        if self._writer is not None:
            self._writer.close()
        plot(history(self.jsonl), self.png)

    def _write(self, record: Record) -> None:
        self._stream.write(json.dumps(record) + "\n")
        self._stream.flush()


def history(jsonl: Path) -> list[Record]:
    """The train and eval records of a metrics.jsonl, the latest one of each (kind, step), by step."""
    latest: dict[tuple[str, int], Record] = {}
    for line in jsonl.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] in ("train", "eval"):
            latest.pop((record["kind"], record["step"]), None)
            latest[(record["kind"], record["step"])] = record
    return sorted(latest.values(), key=lambda record: record["step"])


def panels(records: list[Record]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{title: {series: [(step, value)]}}: the loss, the learning rate (when logged), then one panel per
    head and metric (train, eval)."""
    train = [r for r in records if r["kind"] == "train"]
    found: dict[str, dict[str, list[tuple[float, float]]]] = {
        "loss": {"train": [(r["step"], r["loss"]) for r in train]}
    }
    if any("lr" in r for r in train):
        found["lr"] = {"train": [(r["step"], r["lr"]) for r in train if "lr" in r]}
    for record in records:
        for head, values in record["metrics"].items():
            for metric, value in values.items():
                series = found.setdefault(f"{head} {metric}", {"train": [], "eval": []})
                if value is not None:
                    series[record["kind"]].append((float(record["step"]), float(value)))
    return {title: {name: points for name, points in series.items() if points} for title, series in found.items()}


def plot(records: list[Record], path: Path) -> bool:
    """Draw `records` as a PNG at `path` with matplotlib; False (said once) if it is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        _say_once(
            "matplotlib",
            f"--log-dir: matplotlib is not installed, so no {path.name} "
            "(pip install 'reccompile[plots]'); metrics.jsonl has every record",
        )
        return False
    shown = panels(records)
    columns = min(3, len(shown))
    rows = -(-len(shown) // columns)
    figure = Figure(figsize=(4.5 * columns, 3 * rows), layout="constrained")
    for index, (title, series) in enumerate(shown.items()):
        axes = figure.add_subplot(rows, columns, index + 1)
        for name, points in series.items():
            steps, values = zip(*points)
            axes.plot(steps, values, label=name, marker="o" if name == "eval" else None, markersize=3)
        axes.set_title(title)
        axes.set_xlabel("step")
        if len(series) > 1:
            axes.legend()
    figure.savefig(path, dpi=100)
    return True


def _summary_writer(directory: Path, purge_step: int | None) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        _say_once(
            "tensorboard",
            "--log-dir: tensorboard is not installed, so no TensorBoard events "
            "(pip install 'reccompile[logs]'); writing metrics.jsonl",
        )
        return None
    if purge_step is not None:
        _wait_past_existing_events(directory)
    return SummaryWriter(log_dir=str(directory), purge_step=purge_step)


def _wait_past_existing_events(directory: Path) -> None:
    """TensorBoard reads a directory's event files in name order, and a name starts with its
    creation second, then host, pid and a per-process counter. A resumed run's file must sort
    after the interrupted run's for the purge to apply, which the tail of the name does not
    promise within one second (counter 10 sorts before 9): wait, at most a second, for the next."""
    seconds = [int(path.name.split(".")[3]) for path in directory.glob("events.out.tfevents.*")]
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(max(seconds) + 1 - time.time())


def _add_metrics(writer: Any, kind: str, step: int, metrics: Metrics) -> None:
    for head, values in metrics.items():
        for metric, value in values.items():
            if value is not None:
                writer.add_scalar(f"{kind}/{head}/{metric}", value, step)


_said: set[str] = set()


def _say_once(topic: str, message: str) -> None:
    if topic not in _said:
        _said.add(topic)
        logger.warning(message)
