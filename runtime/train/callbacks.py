"""The training loop's hooks: a small list of callbacks, called in order at a few points of the run.

What the run does beside training (evaluation and metrics, checkpoints every K
steps, the best checkpoint and early stopping, the learning rate's reduction
on a plateau) is each one `Callback`: the loop (runtime.train.loop) and the
worker (runtime.train.worker) know the hook points, never the features.

    on_step_end(step, batch, outputs, loss)   after every step, on every rank
    on_log(entry)                             every --log-every steps and the last
    should_stop()                             after a step's hooks: any yes ends the run
    on_eval(step, metrics)                    after every evaluation pass (all ranks see
                                              rank 0's metrics: decisions taken alike)
    evaluate_on_resume(start_step)            a resumed run evaluates first when any says yes
                                              (a state saved before that step's pass)
    on_train_end(last_step)                   after the last step (or the early stop)
    result()                                  what it adds to the run's last JSON line

A callback that keeps state across a resume registers a Stateful under a name
with the checkpoints (runtime.checkpoint.states), where the store saves it.
So the next feature of this kind is one new file holding its Callback (and its
Stateful, if it has one), plus the line of runtime.train.worker that puts it in
the list: the loop, the store and the other callbacks do not change
(tests/runtime/train/test_callbacks.py plugs one in that way).

Order matters and is the list's: every hook runs in it, so the monitor's
evaluation comes before a checkpoint of the same step, and the plateau's new
rate before the best checkpoint that records it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from runtime.data.batch import Batch
from runtime.reporting.monitor import StepLog

__all__ = ["Callback", "CallbackList", "Metrics"]

Metrics = Mapping[str, Mapping[str, float | None]]


class Callback:
    """The hook points, each a no-op here: a callback overrides the ones it needs."""

    def on_step_end(self, step: int, batch: Batch, outputs: Mapping[str, torch.Tensor], loss: torch.Tensor) -> None:
        """After step `step` (`loss` the local, detached loss; `outputs` the heads' detached outputs)."""

    def on_log(self, entry: StepLog) -> None:
        """On a log step, after every callback's `on_step_end`."""

    def should_stop(self) -> bool:
        """Whether the run ends after this step (every rank must answer alike)."""
        return False

    def on_eval(self, step: int, metrics: Metrics) -> None:
        """After an evaluation pass as of `step`."""

    def evaluate_on_resume(self, start_step: int) -> bool:
        """Whether a run resumed at `start_step` must evaluate before its first step."""
        return False

    def on_train_end(self, last_step: int) -> None:
        """After the last step trained (before the final evaluation)."""

    def result(self) -> Mapping[str, Any]:
        """Entries for the run's result line, asked after the final evaluation."""
        return {}


class CallbackList(Callback):
    """Callbacks called in order; itself a callback, so the loop sees one."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks: list[Callback] = list(callbacks)

    def append(self, callback: Callback | None) -> None:
        """Add `callback` at the end (None, a feature the run does not use, adds nothing)."""
        if callback is not None:
            self.callbacks.append(callback)

    def on_step_end(self, step: int, batch: Batch, outputs: Mapping[str, torch.Tensor], loss: torch.Tensor) -> None:
        for callback in self.callbacks:
            callback.on_step_end(step, batch, outputs, loss)

    def on_log(self, entry: StepLog) -> None:
        for callback in self.callbacks:
            callback.on_log(entry)

    def should_stop(self) -> bool:
        return any([callback.should_stop() for callback in self.callbacks])  # every one asked

    def on_eval(self, step: int, metrics: Metrics) -> None:
        for callback in self.callbacks:
            callback.on_eval(step, metrics)

    def evaluate_on_resume(self, start_step: int) -> bool:
        return any([callback.evaluate_on_resume(start_step) for callback in self.callbacks])

    def on_train_end(self, last_step: int) -> None:
        for callback in self.callbacks:
            callback.on_train_end(last_step)

    def result(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for callback in self.callbacks:
            merged.update(callback.result())
        return merged
