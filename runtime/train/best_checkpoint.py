"""`--best-metric NAME [--patience P]` as a callback: keep the best evaluation's checkpoint, stop on no gain.

The tracker (runtime.train.early_stopping.EarlyStopping) takes every
evaluation pass's metrics; a new best is saved to DIR/best
(runtime.train.checkpointing), and after `patience` passes without a gain
the loop stops. Its state is a checkpoint's (the manifest's "early_stopping"),
so a resumed run counts on; one saved before its step's evaluation pass
evaluates again first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.reporting.monitor import TrainingMonitor
from runtime.train.callbacks import Callback, Metrics
from runtime.train.checkpointing import Checkpointing
from runtime.train.context import RunContext
from runtime.train.early_stopping import EarlyStopping, resolve_best_metric

__all__ = ["BestCheckpoint", "TrackerState", "early_stopping"]


def early_stopping(context: RunContext) -> EarlyStopping | None:
    """The run's tracker, or None without --best-metric (or the spec's `training.early_stopping`)."""
    name = context.options.best_metric
    if name is None:
        return None
    return EarlyStopping(resolve_best_metric(name, context.inputs.heads), context.options.patience)


class TrackerState:
    """The tracker as a checkpoint's state. After a load, `resumed` says whether it goes on from the
    saved one, and `load_notes` (after the checkpoint's path) why not: it tracked another metric."""

    def __init__(self, tracker: EarlyStopping) -> None:
        self.tracker = tracker
        self.resumed = False
        self.load_notes: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return self.tracker.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.resumed = self.tracker.load_state_dict(state_dict)
        self.load_notes = (
            []
            if self.resumed
            else [
                f" tracked --best-metric {state_dict.get('metric')}; this run tracks {self.tracker.metric.name} "
                "from scratch"
            ]
        )


class BestCheckpoint(Callback):
    """Saves each new best evaluation to DIR/best, asks the loop to stop, and names the best in the result.

    `state` is the tracker's, registered with `checkpoints` before they resumed.
    """

    def __init__(
        self, context: RunContext, state: TrackerState, checkpoints: Checkpointing, monitor: TrainingMonitor
    ) -> None:
        self.tracker, self.state = state.tracker, state
        self.checkpoints, self.monitor = checkpoints, monitor
        self.steps, self.eval_every = context.steps, context.options.eval_every
        if state.resumed:
            checkpoints.found_best(self.tracker.best_step)

    def on_eval(self, step: int, metrics: Metrics) -> None:
        if self.tracker.observe(step, metrics):
            self.checkpoints.save_best(step)

    def should_stop(self) -> bool:
        return self.tracker.should_stop()

    def evaluate_on_resume(self, start_step: int) -> bool:
        return self.state.resumed and self.tracker.missed(start_step, self.eval_every)

    def on_train_end(self, last_step: int) -> None:
        reason = self.tracker.stop_reason
        if reason is not None and last_step < self.steps:
            self.monitor.stop(last_step, reason)

    def result(self) -> Mapping[str, Any]:
        best_path = self.checkpoints.best_path
        saved = {} if best_path is None else {"checkpoint": str(best_path)}
        return {"best": {**self.tracker.best(), **saved}}
