"""Fanned-out ids, bucketized columns and position weights agree between training, export and predict.

A spec trains 2 steps, is exported at fp32 and predicted by `reccompile predict`; every score must
equal the trained model's own (training module, checkpoint loaded) on the batches the training
reader makes of the same rows: Criteo lines for the fan-out and buckets, synthetic rows for a
position-weighted feature (Criteo has single ids).
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.loader import epoch_batches
from runtime.data.sources import DataChoice, open_reader
from runtime.data.synthetic.batches import make_batch
from runtime.serving.export_dir import head_scores, read_export_manifest
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime" / "data"))
from sample_files import criteo_line, write_lines  # noqa: E402

CRITEO = """\
version: 1
name: wide_criteo
features:
  dense:
    - {name: int, size: 13}
  sparse:
    - {name: cat, count: 26, num_embeddings: 500, dim: 4}
    - {name: wide, count: 26, column: cat, num_embeddings: 500, dim: 4}
    - {name: int_bucket, count: 13, column: int, boundaries: [0.5, 1, 1.5, 2, 3], dim: 4}
model:
  deep: {type: mlp, input: [dense.int, sparse.*], layers: [8, 1], final_activation: none}
heads:
  - {name: click, input: deep, loss: bce}
training:
  batch_size: 32
  dense_optimizer: {type: adagrad, lr: 0.5}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.5}
"""
SYNTHETIC = """\
version: 1
name: weighted_positions
features:
  dense:
    - {name: num, size: 2}
  sparse:
    - {name: tags, num_embeddings: 50, dim: 4, max_ids_per_sample: 4, position_weights: true}
    - {name: wide_tags, column: tags, num_embeddings: 50, dim: 4}
    - {name: num_bucket, count: 2, column: num, boundaries: [-1, 0, 1], dim: 4}
model:
  deep: {type: mlp, input: [dense.num, sparse.*], layers: [8, 1], final_activation: none}
heads:
  - {name: click, input: deep, loss: bce}
training:
  batch_size: 32
  dense_optimizer: {type: adagrad, lr: 0.5}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.5}
"""


def _train_and_export(root: Path, text: str, data: list[str]) -> Path:
    spec = root / "spec.yaml"
    spec.write_text(text)
    assert (
        main(
            [
                "train",
                str(spec),
                *data,
                "--data-workers",
                "0",
                "--steps",
                "2",
                "--log-every",
                "2",
                "--checkpoint-dir",
                str(root / "ckpt"),
                "--checkpoint-every",
                "2",
                "-o",
                str(root / "build"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "export",
                str(spec),
                "--checkpoint",
                str(root / "ckpt"),
                "--quantize",
                "none",
                "--no-aot",
                "-o",
                str(root / "out"),
            ]
        )
        == 0
    )
    return spec


def _trained(root: Path, name: str):
    module = load_module(str(root / "build" / f"{name}.py"))
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    load_checkpoint(root / "ckpt", model, optimizer, spec_sha256=module.SPEC_SHA256)
    return module, model.eval()


def _predicted(root: Path, args: list[str]) -> list[float]:
    output = root / "predictions.csv"
    assert main(["predict", str(root / "out"), *args, "-o", str(output)]) == 0
    with open(output, newline="") as stream:
        return [float(row[-1]) for row in list(csv.reader(stream))[1:]]


def _scores(module, model, batch) -> list[float]:
    with torch.no_grad():
        return head_scores(model(batch.dense, batch.sparse), module.HEADS)["click"].tolist()


def test_criteo_fan_out_and_buckets_predict_as_trained(tmp_path: Path) -> None:
    rng = random.Random(5)
    data = write_lines(tmp_path / "day_0.txt", [criteo_line(rng) for _ in range(48)])
    _train_and_export(tmp_path, CRITEO, ["--data", f"criteo:{data}"])
    module, model = _trained(tmp_path, "wide_criteo")
    reader = open_reader(module.INPUTS, DataChoice("criteo", str(data)))
    (local,) = epoch_batches(reader, global_batch=48, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=0)
    got = _predicted(tmp_path, ["--data", f"criteo:{data}", "--batch-size", "48"])
    assert got == pytest.approx(_scores(module, model, local.batch), abs=1e-6)


def test_position_weights_are_exported_and_predict_as_trained(tmp_path: Path) -> None:
    _train_and_export(tmp_path, SYNTHETIC, [])
    module, model = _trained(tmp_path, "weighted_positions")
    trained = model._position_weights["tags"].weight.detach()
    assert (trained - 1).abs().max() > 1e-3
    got = _predicted(tmp_path, ["--rows", "32", "--batch-size", "32"])
    batch = make_batch(module.INPUTS, 32, step=0, seed=module.INPUTS.training.seed)
    assert got == pytest.approx(_scores(module, model, batch), abs=1e-6)


def test_the_exported_program_names_the_keys_a_caller_derives(tmp_path: Path) -> None:
    spec = _train_and_export(tmp_path, CRITEO, [])
    assert main(["export", str(spec), "--checkpoint", str(tmp_path / "ckpt"), "-o", str(tmp_path / "aot")]) == 0
    derived = read_export_manifest(tmp_path / "aot")["aot"]["derived_keys"]
    assert sorted(derived) == sorted([f"wide_{i}" for i in range(26)] + [f"int_bucket_{i}" for i in range(13)])
    assert derived["wide_3"] == {"copy_of": "cat_3"}
    assert derived["int_bucket_12"] == {"bucketize": "int", "column": 12, "boundaries": [0.5, 1.0, 1.5, 2.0, 3.0]}
