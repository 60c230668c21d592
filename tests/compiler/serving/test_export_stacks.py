"""`reccompile export` and `reccompile predict` of a field stack model: train -> checkpoint -> export -> predict.

The spec stacks pooled features, a vector block and a dense feature with
`embed`, and reads the stack with every stack block (self_attention, cin,
wukong, mask_block, flatten) and with dot and fm. It is trained for a few
steps, exported in fp32 and with int8 tables, and scored with `reccompile
predict`; the reference is the training module in eval mode with the
checkpoint loaded. Stated bounds on the click probability: fp32 exactly
equal (the same kernels and order of summation), int8 tables <= 2e-3.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

SPEC = """\
version: 1
name: stack_rec
features:
  dense:
    - {name: num, size: 3, embed: {dim: 8, bias: true}}
    - {name: raw, size: 4}
  sparse:
    - {name: cat, count: 4, num_embeddings: 120, dim: 8}
model:
  bottom: {type: mlp, input: dense.raw, layers: [16, 8]}
  fields: {type: stack, input: [sparse.*, bottom, dense.num]}
  att:    {type: self_attention, input: fields, num_layers: 2, num_heads: 2, attention_dim: 4}
  att_v:  {type: flatten, input: att}
  cin:    {type: cin, input: fields, layer_sizes: [6, 4]}
  wk:     {type: wukong, input: fields, num_fmb: 3, num_lcb: 2, rank: 2, fmb_layers: [16]}
  wk_v:   {type: flatten, input: wk}
  masks:  {type: mask_block, input: fields, mode: parallel, block_sizes: [8, 8], reduction_ratio: 2}
  pairs:  {type: dot, input: [bottom, fields]}
  fm:     {type: fm, input: dense.num}
  top:    {type: mlp, input: [att_v, cin, wk_v, masks, pairs, fm], layers: [16, 1]}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 64
  seed: 3
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}
"""
EXPORTS = {"fp32": ["--quantize", "none"], "int8": ["--quantize", "int8"]}
BOUNDS = {"fp32": 0.0, "int8": 2e-3}
ROWS, BATCH, SEED = 100, 50, 7


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export_stacks")
    (root / "stack.yaml").write_text(SPEC)
    code = main(
        [
            "train",
            str(root / "stack.yaml"),
            "--steps",
            "3",
            "--batch-size",
            "64",
            "--log-every",
            "3",
            "--checkpoint-dir",
            str(root / "ckpt"),
            "--checkpoint-every",
            "3",
            "-o",
            str(root / "build"),
        ]
    )
    assert code == 0
    for name, options in EXPORTS.items():
        code = main(
            ["export", str(root / "stack.yaml"), "--checkpoint", str(root / "ckpt"), *options, "-o", str(root / name)]
        )
        assert code == 0
    return root


def _reference(work: Path) -> list[float]:
    module = load_module(str(work / "build" / "stack_rec.py"))
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    load_checkpoint(work / "ckpt", model, optimizer, spec_sha256=module.SPEC_SHA256)
    model.eval()
    scores: list[float] = []
    with torch.no_grad():
        for step, start in enumerate(range(0, ROWS, BATCH)):
            batch = module.synthetic_batch(min(BATCH, ROWS - start), step=step, seed=SEED)
            scores += torch.sigmoid(model(batch.dense, batch.sparse)["click"]).tolist()
    return scores


def _predicted(work: Path, export: str, capsys: pytest.CaptureFixture[str]) -> list[float]:
    output = work / f"{export}.csv"
    args = ["predict", str(work / export), "--rows", str(ROWS), "--batch-size", str(BATCH), "--seed", str(SEED)]
    assert main([*args, "-o", str(output)]) == 0
    capsys.readouterr()
    with open(output, newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows[0] == ["id", "click"]
    return [float(row[1]) for row in rows[1:]]


@pytest.mark.parametrize("export", ["fp32", "int8"])
def test_a_stack_model_exports_and_predicts_what_it_scored_in_training(
    work: Path, export: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = [float(f"{v:.9g}") for v in _reference(work)]  # as predict writes them
    predicted = _predicted(work, export, capsys)
    assert len(predicted) == len(reference) == ROWS
    worst = max(abs(a - b) for a, b in zip(predicted, reference))
    assert worst <= BOUNDS[export], worst
