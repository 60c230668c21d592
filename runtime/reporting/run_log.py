"""`--log-dir DIR`: a run's metrics as JSON lines, and a plot of them at the end.

    DIR/metrics.jsonl   one object per line, written as the run goes:
                        {"kind": "train", "step", "loss", "samples_per_s", "metrics": {head: {metric: value}}}
                        {"kind": "eval", "step", "metrics": {...}}
                        {"kind": "final", ...the run's final JSON line}
    DIR/metrics.png     the loss, then every head's metrics (train and eval), against the step

Written by rank 0 only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from runtime.reporting.plot_png import Panel, Series, line_chart

Metrics = Mapping[str, Mapping[str, float | None]]


class RunLog:
    """Appends records to DIR/metrics.jsonl; `close()` draws DIR/metrics.png."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.directory / "metrics.jsonl"
        self.png = self.directory / "metrics.png"
        self._stream = open(self.jsonl, "w")
        self._records: list[dict[str, Any]] = []

    def train(self, step: int, loss: float, samples_per_s: float, metrics: Metrics) -> None:
        self._write(
            {"kind": "train", "step": step, "loss": loss, "samples_per_s": round(samples_per_s, 1), "metrics": metrics}
        )

    def eval(self, step: int, metrics: Metrics) -> None:
        self._write({"kind": "eval", "step": step, "metrics": metrics})

    def close(self, final: Mapping[str, Any]) -> None:
        """Write the final record and the plot."""
        self._write({"kind": "final", **final})
        self._stream.close()
        self.png.write_bytes(line_chart(self.panels()))

    def panels(self) -> list[Panel]:
        """The loss panel, then one panel per head and metric with its train and eval series."""
        train = [r for r in self._records if r["kind"] == "train"]
        evals = [r for r in self._records if r["kind"] == "eval"]
        panels = [Panel("loss", [Series("train", [(r["step"], r["loss"]) for r in train])])]
        names: dict[tuple[str, str], None] = {}
        for record in (*train, *evals):
            for head, values in record["metrics"].items():
                names.update({(head, metric): None for metric in values})
        for head, metric in names:
            series = [
                Series(kind, points)
                for kind, records in (("train", train), ("eval", evals))
                if (points := _points(records, head, metric))
            ]
            panels.append(Panel(f"{head} {metric}", series))
        return panels

    def _write(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        self._stream.write(json.dumps(record) + "\n")
        self._stream.flush()


def _points(records: list[dict[str, Any]], head: str, metric: str) -> list[tuple[float, float]]:
    points = []
    for record in records:
        value = record["metrics"].get(head, {}).get(metric)
        if value is not None:
            points.append((float(record["step"]), float(value)))
    return points
