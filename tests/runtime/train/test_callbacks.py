"""runtime/train/callbacks.py: a feature of the loop's kind plugs in as one callback, the loop untouched.

`SeenLabels` is such a feature, written here and nowhere else: it counts the
positive labels trained on, ends the run when asked to, and keeps its count in
the checkpoints through the Stateful registry, so a resumed run counts on.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import checkpoint_cases as cc
import pytest
import torch

from runtime.data.batch import Batch
from runtime.reporting.monitor import StepLog
from runtime.train.callbacks import Callback, CallbackList
from runtime.train.checkpointing import Checkpointing
from runtime.train.context import RunContext
from runtime.train.loop import train
from runtime.train.options import TrainOptions
from runtime.train.worker import load_module

STEPS = 6


class SeenLabels(Callback):
    """Positive labels trained on so far (a Stateful too); stops the run after `stop_after` steps."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.positives = 0
        self.stop_after = stop_after
        self.events: list[tuple[str, int]] = []
        self._step = 0

    def on_step_end(self, step: int, batch: Batch, outputs: Mapping[str, torch.Tensor], loss: torch.Tensor) -> None:
        self.positives += int(sum(labels.sum() for labels in batch.labels.values()))
        self._step = step
        self.events.append(("step", step))

    def on_log(self, entry: StepLog) -> None:
        self.events.append(("log", entry.step))

    def should_stop(self) -> bool:
        return self.stop_after is not None and self._step >= self.stop_after

    def state_dict(self) -> dict[str, Any]:
        return {"positives": self.positives}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.positives = int(state_dict["positives"])


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):
    return load_module(str(cc.compile_modules(tmp_path_factory.mktemp("modules"), (1,))[1]))


def _context(module, steps: int = STEPS, **given: Any) -> RunContext:
    options = TrainOptions(
        module=module.__file__, steps=steps, batch_size=cc.BATCH, seed=0, log_every=2, pipeline=False, **given
    )
    return RunContext(options, module.INPUTS, module.SPEC_SHA256, module.PLAN)


def _batches(module, start: int = 0):
    return (module.synthetic_batch(cc.BATCH, step=step) for step in itertools.count(start))


def _manifest(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "manifest.json").read_text())


def _positives(module, steps: range) -> int:
    return sum(int(sum(y.sum() for y in module.synthetic_batch(cc.BATCH, step=s).labels.values())) for s in steps)


def test_a_callback_sees_every_hook_in_order_and_ends_the_run(module) -> None:
    model, optimizer = cc.fresh(module)
    uninterrupted = train(_context(module), model, _batches(module), optimizer).losses
    model, optimizer = cc.fresh(module)
    seen = SeenLabels(stop_after=3)
    summary = train(_context(module), model, _batches(module), optimizer, callbacks=CallbackList([seen]))
    # Step 3 ends the run and is logged (log_every 2 would not log it).
    assert seen.events == [("step", 1), ("step", 2), ("log", 2), ("step", 3), ("log", 3)]
    assert summary.steps == 3 and summary.losses == uninterrupted[:3]
    assert seen.positives == _positives(module, range(3)) > 0


def test_its_state_goes_with_the_checkpoints_and_comes_back_on_resume(module, tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    model, optimizer = cc.fresh(module)
    context = _context(module, steps=4, checkpoint_dir=directory, checkpoint_every=2)
    checkpoints, seen = Checkpointing(context, model, optimizer), SeenLabels()
    checkpoints.register("seen_labels", seen)
    try:
        assert checkpoints.resume() == 0
        train(context, model, _batches(module), optimizer, callbacks=CallbackList([seen, checkpoints]))
    finally:
        checkpoints.close()
    assert _manifest(directory / "step_00000002")["seen_labels"] == {"positives": _positives(module, range(2))}

    model, optimizer = cc.fresh(module)
    context = _context(module, steps=STEPS, checkpoint_dir=directory, checkpoint_every=2, resume=True)
    checkpoints, resumed = Checkpointing(context, model, optimizer), SeenLabels()
    checkpoints.register("seen_labels", resumed)
    try:
        start = checkpoints.resume()
        assert start == 4 and resumed.positives == _positives(module, range(4))
        train(
            context,
            model,
            _batches(module, start),
            optimizer,
            callbacks=CallbackList([resumed, checkpoints]),
            start_step=start,
        )
    finally:
        checkpoints.close()
    assert resumed.positives == _positives(module, range(STEPS))
    assert _manifest(directory / f"step_{STEPS:08d}")["seen_labels"] == {"positives": resumed.positives}
