"""runtime/train/timing.py and the loop: samples/s counts training steps only.

Every step's hook spends SLEEP seconds "evaluating" and as long "saving";
the loop's samples/s must leave all of it out, and the run reports both.
"""

from __future__ import annotations

import itertools
import time

import pytest

import checkpoint_cases as cc
from runtime.train.callbacks import Callback
from runtime.train.context import RunContext
from runtime.train.loop import train
from runtime.train.options import TrainOptions
from runtime.train.timing import OtherWork
from runtime.train.worker import load_module

SLEEP = 0.1
STEPS = 6


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):
    return load_module(str(cc.compile_modules(tmp_path_factory.mktemp("modules"), (1,))[1]))


def test_samples_per_s_leaves_out_evaluation_and_checkpoint_time(module) -> None:
    model, optimizer = cc.fresh(module)
    other = OtherWork()

    class Busy(Callback):
        def on_step_end(self, *_: object) -> None:
            with other.measure("eval"):
                time.sleep(SLEEP)
            with other.measure("checkpoint"):
                time.sleep(SLEEP)

    batches = (module.synthetic_batch(cc.BATCH, step=step) for step in itertools.count())
    context = RunContext(
        TrainOptions(module=module.__file__, steps=STEPS, batch_size=cc.BATCH), module.INPUTS, other_work=other
    )
    started = time.perf_counter()
    summary = train(context, model, batches, optimizer, callbacks=Busy())
    wall = time.perf_counter() - started
    # samples/s times steps 2..STEPS; the hooks of those steps slept 2 * SLEEP each.
    training_seconds = cc.BATCH * (STEPS - 1) / summary.samples_per_s
    assert training_seconds < wall - (STEPS - 1) * 2 * SLEEP
    assert other.seconds["eval"] >= STEPS * SLEEP and other.seconds["checkpoint"] >= STEPS * SLEEP
    assert set(other.as_json()) == {"eval_seconds", "checkpoint_seconds"}


def test_a_run_of_one_step_reports_no_rate_rather_than_zero(module) -> None:
    """The first step warms up and is not timed: one step leaves nothing to measure."""
    model, optimizer = cc.fresh(module)
    batches = (module.synthetic_batch(cc.BATCH, step=step) for step in itertools.count())
    context = RunContext(TrainOptions(module=module.__file__, steps=1, batch_size=cc.BATCH), module.INPUTS)
    summary = train(context, model, batches, optimizer)
    assert summary.steps == 1 and summary.samples_per_s is None
    assert summary.as_json()["samples_per_s"] is None
