"""runtime/train/lr_scheduler.py with the loop, the pipeline, checkpoints and the run's log.

A cosine schedule with warmup on the checkpoint tests' tiny spec: the rates
set per step against the formula, the pipelined loop against the plain one,
and a run of 6 steps against 3 steps, a checkpoint, a resume and 3 more
(equal tables and dense weights, exactly), with the rate of every step in
metrics.jsonl and on the console.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import checkpoint_cases as cc
import pytest
import torch

from runtime.checkpoint.store import load_model_state, read_checkpoint_manifest
from runtime.config.lr_schedule import LrSchedule
from runtime.train import worker
from runtime.train.context import RunContext
from runtime.train.early_stopping import BestMetric
from runtime.train.loop import train
from runtime.train.lr_plateau import LrPlateau
from runtime.train.lr_scheduler import LrScheduler
from runtime.train.options import TrainOptions
from runtime.train.worker import load_module

SCHEDULE = "  lr_schedule: {type: cosine, warmup_steps: 2, start_factor: 0.5, total_steps: 5, final_factor: 0.1}\n"
SPEC = cc.SPEC.replace(
    "  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}\n",
    "  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}\n" + SCHEDULE,
)
EXPECTED = LrSchedule("cosine", warmup_steps=2, start_factor=0.5, total_steps=5, final_factor=0.1)
BASE_LR = 0.05  # both optimizers'


@pytest.fixture(scope="module")
def module_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert SCHEDULE in SPEC
    return cc.compile_modules(tmp_path_factory.mktemp("modules"), (1,), SPEC)[1]


def test_the_module_carries_the_specs_schedule(module_path: Path) -> None:
    module = load_module(str(module_path))
    assert module.LR_SCHEDULE == LrSchedule(
        "cosine", 2, 0.5, total_steps=5, final_factor=0.1, where=f"{module_path.parent.parent}/ckpt_tiny.yaml:23:3"
    )


def test_each_step_sets_the_dense_and_table_rates_of_the_formula(module_path: Path) -> None:
    module = load_module(str(module_path))
    model, optimizer = cc.fresh(module)
    scheduler = LrScheduler(module.LR_SCHEDULE, optimizer, model)
    tbes = [g.tbe for c in model.sparse_arch._collections() for g in c._groups]
    assert tbes  # the tiny spec's tables are on fbgemm's fused kernel
    for completed in range(7):
        scale = scheduler.start_step(completed)
        assert scale == EXPECTED.factor(completed)
        assert [group["lr"] for group in optimizer.param_groups] == [BASE_LR * scale]
        assert [tbe.get_learning_rate() for tbe in tbes] == pytest.approx([BASE_LR * scale] * len(tbes), rel=1e-6)


def test_a_plateau_multiplies_the_step_factor_and_resumes_with_it(module_path: Path) -> None:
    module = load_module(str(module_path))
    model, optimizer = cc.fresh(module)
    tbes = [g.tbe for c in model.sparse_arch._collections() for g in c._groups]
    scheduler = LrScheduler(module.LR_SCHEDULE, optimizer, model, LrPlateau(BestMetric("click", "auc"), patience=0))
    scheduler.start_step(3)
    assert scheduler.observe({"click": {"auc": 0.7}}) == EXPECTED.factor(3)
    assert scheduler.observe({"click": {"auc": 0.6}}) == pytest.approx(EXPECTED.factor(3) * 0.1)
    assert tbes[0].get_learning_rate() == pytest.approx(BASE_LR * EXPECTED.factor(3) * 0.1, rel=1e-6)
    saved = scheduler.state_dict(4)
    assert saved["next_scale"] == pytest.approx(EXPECTED.factor(4) * 0.1)
    model, optimizer = cc.fresh(module)
    resumed = LrScheduler(module.LR_SCHEDULE, optimizer, model, LrPlateau(BestMetric("click", "auc"), patience=0))
    assert resumed.load_state_dict(saved) and resumed.resumed_plateau
    assert resumed.lr == pytest.approx(BASE_LR * EXPECTED.factor(4) * 0.1)
    assert resumed.observe({"click": {"auc": 0.69}}) == pytest.approx(EXPECTED.factor(4) * 0.01)  # best 0.7 kept
    other = LrScheduler(module.LR_SCHEDULE, optimizer, model, LrPlateau(BestMetric("click", "ne")))
    assert other.load_state_dict(saved) and not other.resumed_plateau


def test_the_pipeline_trains_the_schedule_of_the_plain_loop(module_path: Path) -> None:
    module = load_module(str(module_path))
    runs = []
    for depth in (1, 2):
        model, optimizer = cc.fresh(module)
        batches = (module.synthetic_batch(cc.BATCH, step=step) for step in range(6))
        scheduler = LrScheduler(module.LR_SCHEDULE, optimizer, model)
        options = TrainOptions(
            module=str(module_path), steps=6, batch_size=cc.BATCH, pipeline=True, pipeline_depth=depth
        )
        summary = train(RunContext(options, module.INPUTS), model, batches, optimizer, lr_scheduler=scheduler)
        runs.append((summary.losses, cc.full_state(model)))
    (plain_losses, plain_state), (piped_losses, piped_state) = runs
    assert plain_losses == piped_losses
    assert plain_state.keys() == piped_state.keys()
    for key in plain_state:
        assert torch.equal(plain_state[key], piped_state[key]), key


def test_a_resumed_run_continues_the_schedule_exactly(module_path: Path, tmp_path: Path, capsys) -> None:
    def run(directory: Path, steps: int, **options: object) -> str:
        options = {"log_every": 1, "checkpoint_dir": directory / "ck", "log_dir": directory / "logs", **options}
        assert worker.run(TrainOptions(module=str(module_path), steps=steps, **options)) == 0
        return capsys.readouterr().out

    straight = run(tmp_path / "straight", 6)
    run(tmp_path / "split", 3)
    resumed = run(tmp_path / "split", 6, resume=True)
    assert "resumed from" in resumed and "at step 3 (--resume)" in resumed

    one, two = load_model_state(tmp_path / "straight" / "ck"), load_model_state(tmp_path / "split" / "ck")
    assert one.keys() == two.keys() and any(".weight" in key for key in one)
    for key in one:
        assert torch.equal(one[key], two[key]), key

    for directory in ("straight", "split"):
        records = [
            json.loads(line) for line in (tmp_path / directory / "logs" / "metrics.jsonl").read_text().splitlines()
        ]
        rates = {r["step"]: (r["lr"], r["lr_scale"]) for r in records if r["kind"] == "train"}
        assert rates == {step: (BASE_LR * EXPECTED.factor(step - 1), EXPECTED.factor(step - 1)) for step in range(1, 7)}
    shown = [float(rate) for rate in re.findall(r"^step +\d+/6  loss \S+  lr (\S+)  samples/s", straight, re.M)]
    assert shown == pytest.approx([BASE_LR * EXPECTED.factor(t) for t in range(6)], rel=1e-3)

    manifest = read_checkpoint_manifest(tmp_path / "split" / "ck")
    assert manifest["lr_schedule"] == {
        "schedule": {"type": "cosine", "warmup_steps": 2, "start_factor": 0.5, "total_steps": 5, "final_factor": 0.1},
        "completed": 6,
        "next_scale": pytest.approx(0.1),
    }


def test_resuming_under_another_schedule_says_so(module_path: Path, tmp_path: Path, capsys) -> None:
    ck = tmp_path / "ck"
    assert worker.run(TrainOptions(module=str(module_path), steps=2, checkpoint_dir=ck)) == 0
    other_spec = SPEC.replace("total_steps: 5", "total_steps: 8")
    other = cc.compile_modules(tmp_path / "other", (1,), other_spec)[1]
    capsys.readouterr()
    assert (
        worker.run(TrainOptions(module=str(other), steps=3, checkpoint_dir=ck, resume=True, allow_spec_change=True))
        == 0
    )
    err = capsys.readouterr().err
    assert (
        f"warning: {ck}/step_00000002 was trained with lr_schedule cosine(warmup_steps=2, start_factor=0.5, "
        "total_steps=5, final_factor=0.1); this run goes on from step 2 with cosine(warmup_steps=2, "
        "start_factor=0.5, total_steps=8, final_factor=0.1)\n"
    ) in err
