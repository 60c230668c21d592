"""The training loop logs the objective it trains: the heads' loss plus the tables' `embedding_l2` penalty.

The pipeline tests' DLRM (five tables, one per sharding type, mean-pooled,
weighted and multi-hot features) compiled with `embedding_l2` on its sparse
optimizer: the losses `runtime.train.loop.train` returns, plain and
pipelined, equal each step's heads' loss plus (l2 / 2) * sum ||w_r||^2 over
the distinct ids of each table in the batch, read from the tables before
the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pipeline_cases as pc
import pytest
import torch

from compiler.pipeline import Options, generate
from runtime.train.context import RunContext
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.loop import train, train_step
from runtime.train.options import TrainOptions
from runtime.train.worker import load_module

L2 = 0.05
STEPS = 4


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    outdir = tmp_path_factory.mktemp("l2_loop")
    spec = outdir / "l2.yaml"
    plain = "sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}"
    text = pc.spec_text("mixed")
    assert plain in text
    spec.write_text(text.replace(plain, f"sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1, embedding_l2: {L2}}}"))
    return load_module(str(generate(str(spec), Options(world_size=1)).write(Path(outdir) / "ws1")[0]))


def expected_losses(module: Any) -> list[float]:
    """Each step's heads' loss plus the penalty of the batch's distinct ids, from the tables before the step."""
    torch.manual_seed(pc.SEED)
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    losses = []
    for step in range(STEPS):
        batch = module.synthetic_batch(pc.GLOBAL_BATCH, step=step)
        tables = model.sparse_arch.full_state_dict()
        penalty = sum(
            (L2 / 2) * tables[f"{name}.weight"][torch.unique(batch.sparse[name].values())].square().sum()
            for name in pc.TABLES
        )
        losses.append(float(train_step(model, optimizer, batch)) + float(penalty))
    return losses


@pytest.mark.parametrize("depth", [1, 2])
def test_logged_loss_is_the_loss_plus_the_penalty(module: Any, depth: int) -> None:
    torch.manual_seed(pc.SEED)
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    source = iter([module.synthetic_batch(pc.GLOBAL_BATCH, step=step) for step in range(STEPS)])
    options = TrainOptions(module="", steps=STEPS, batch_size=pc.GLOBAL_BATCH, pipeline=depth > 1, pipeline_depth=depth)
    losses = train(RunContext(options, module.INPUTS), model, source, optimizer).losses
    assert losses == pytest.approx(expected_losses(module), rel=1e-6)
