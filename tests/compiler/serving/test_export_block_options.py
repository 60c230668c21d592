"""Serving a model with batch norm, dropout, groups, PLE and a probability head (ESMM's shape).

Trained 3 steps with `reccompile train`, exported in fp32 and scored by
`reccompile predict`: the scores equal the training module's in eval mode
(batch norm on its running statistics, dropout off) exactly, and the
probability head's column is its output as it is, not a sigmoid of it.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

SPEC = """\
version: 1
name: options_rec
features:
  dense:
    - {name: age, size: 4}
  sparse:
    - {name: user_id, num_embeddings: 100, dim: 8}
    - {name: item_id, num_embeddings: 100, dim: 8}
groups:
  user: [sparse.user_id, dense.age]
model:
  experts: {type: moe, input: [groups.user, sparse.item_id], num_experts: 1, task_experts: 1, levels: 2,
            expert_layers: [16], tasks: [ctr, cvr]}
  ctr_tower: {type: mlp, input: experts.ctr, layers: [16, 1], norm: batch, dropout: 0.2}
  cvr_tower: {type: mlp, input: experts.cvr, layers: [16, 16, 1], norm: layer, dropout: 0.1, residual: true,
              final_activation: none}
  ctr_p: {type: activation, input: ctr_tower, fn: sigmoid}
  cvr_p: {type: activation, input: cvr_tower, fn: sigmoid}
  ctcvr_p: {type: product, input: [ctr_p, cvr_p]}
heads:
  - {name: ctr, input: ctr_tower, loss: bce}
  - {name: ctcvr, input: ctcvr_p, loss: bce, output: probability}
training:
  batch_size: 64
  dense_optimizer: {type: adam, lr: 0.01}
"""
ROWS, BATCH, SEED = 100, 50, 3


def test_fp32_export_scores_the_eval_model_and_keeps_the_probability(tmp_path: Path, capsys) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    assert (
        main(
            [
                "train",
                str(tmp_path / "spec.yaml"),
                "--steps",
                "3",
                "--log-every",
                "3",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--checkpoint-every",
                "3",
                "-o",
                str(tmp_path / "build"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "export",
                str(tmp_path / "spec.yaml"),
                "--checkpoint",
                str(tmp_path / "ckpt"),
                "--quantize",
                "none",
                "-o",
                str(tmp_path / "fp32"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "predict",
                str(tmp_path / "fp32"),
                "--rows",
                str(ROWS),
                "--batch-size",
                str(BATCH),
                "--seed",
                str(SEED),
                "-o",
                str(tmp_path / "scores.csv"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    with open(tmp_path / "scores.csv", newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows[0] == ["id", "ctr", "ctcvr"]

    module = load_module(str(tmp_path / "build" / "options_rec.py"))
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    load_checkpoint(tmp_path / "ckpt", model, optimizer, spec_sha256=module.SPEC_SHA256)
    assert int(model.ctr_tower.norms[0].num_batches_tracked) == 3  # trained with batch statistics
    model.eval()
    expected = []
    with torch.no_grad():
        for step, start in enumerate(range(0, ROWS, BATCH)):
            batch = module.synthetic_batch(BATCH, step=step, seed=SEED)
            outputs = model(batch.dense, batch.sparse)
            again = model(batch.dense, batch.sparse)
            torch.testing.assert_close(again["ctcvr"], outputs["ctcvr"], rtol=0, atol=0)  # no dropout in eval
            scores = torch.stack([torch.sigmoid(outputs["ctr"]), outputs["ctcvr"]], dim=1)
            expected += [[str(start + i), *(f"{v:.9g}" for v in values)] for i, values in enumerate(scores.tolist())]
    assert rows[1:] == expected
