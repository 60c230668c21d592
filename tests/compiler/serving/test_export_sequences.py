"""`reccompile export` and `reccompile predict` of a sequence model: train -> checkpoint -> export -> predict.

The spec has a pooled table (`user`), a sequence table serving a pooled
feature and a sequence (`items`: the target `item`, pooled by mean from its
row, and the `history`), and a wider sequence table (`pages`, keep: start),
read by DIN's target attention, a transformer with the target prepended and
sequence pools. It is trained for a few steps, exported at several
precisions and scored with `reccompile predict`; the reference is the
training module in eval mode with the checkpoint loaded.

Stated bounds on the click probability against that reference, on this
model: fp32 exactly equal (the same rows, kernels and order of summation);
fp16 tables <= 5e-5; int8 <= 1e-3; int4/fp16/int8 mixed <= 2e-3; int8 tables
with the dense blocks (transformer and attention included) in bfloat16
<= 5e-3 (measured: 8.3e-6, 1.0e-4, 2.3e-4 and 6.6e-4).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.serving.export_dir import load
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

SPEC = """\
version: 1
name: seq_rec
features:
  dense:
    - {name: num, size: 4}
  sparse:
    - {name: user, num_embeddings: 60, dim: 8}
    - {name: item, table: items}
    - {name: history, table: items, pooling: none, max_length: 6}
    - {name: pages, num_embeddings: 30, dim: 16, pooling: none, max_length: 5, keep: start}
tables:
  - {name: items, num_embeddings: 80, dim: 8, pooling: mean}
model:
  din: {type: target_attention, input: sparse.history, query: sparse.item, hidden: [16, 8]}
  encoder: {type: transformer, input: sparse.history, prepend: [sparse.item], num_heads: 2, ffn_dim: 16}
  target: {type: sequence_pool, input: encoder, mode: first}
  pages_mean: {type: sequence_pool, input: sparse.pages, mode: mean}
  top: {type: mlp, input: [dense.num, sparse.user, sparse.item, din, target, pages_mean], layers: [16, 1],
        final_activation: none}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 32
  seed: 5
  dense_optimizer: {type: adagrad, lr: 0.05}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}
"""
EXPORTS = {
    "fp32": ["--quantize", "none"],
    "fp16": ["--quantize", "fp16"],
    "int8": ["--quantize", "int8"],
    "mixed": ["--per-table", "user=int4,items=fp16,pages=int8"],
    "bf16": ["--quantize", "int8", "--dense", "bf16"],
}
BOUNDS = {"fp32": 0.0, "fp16": 5e-5, "int8": 1e-3, "mixed": 2e-3, "bf16": 5e-3}
ROWS, BATCH, SEED = 100, 32, 11


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The spec, its training run and checkpoint, and one export per entry of EXPORTS."""
    root = tmp_path_factory.mktemp("export_sequences")
    (root / "seq.yaml").write_text(SPEC)
    code = main(
        [
            "train",
            str(root / "seq.yaml"),
            "--steps",
            "3",
            "--batch-size",
            str(BATCH),
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
            ["export", str(root / "seq.yaml"), "--checkpoint", str(root / "ckpt"), *options, "-o", str(root / name)]
        )
        assert code == 0
    return root


def trained_model(work: Path, name: str = "seq_rec") -> tuple[object, torch.nn.Module]:
    """The training module and its model in eval mode, the checkpoint loaded."""
    module = load_module(str(work / "build" / f"{name}.py"))
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    load_checkpoint(work / "ckpt", model, optimizer, spec_sha256=module.SPEC_SHA256)
    return module, model.eval()


def reference_scores(work: Path, name: str = "seq_rec") -> list[list[str]]:
    """The training model's click probabilities on predict's synthetic batches."""
    module, model = trained_model(work, name)
    rows = []
    with torch.no_grad():
        for step, start in enumerate(range(0, ROWS, BATCH)):
            batch = module.synthetic_batch(min(BATCH, ROWS - start), step=step, seed=SEED)
            scores = torch.sigmoid(model(batch.dense, batch.sparse)["click"])
            rows += [[str(start + i), f"{v:.9g}"] for i, v in enumerate(scores.tolist())]
    return rows


def predicted(work: Path, export: str, capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    output = work / f"{export}.csv"
    code = main(
        [
            "predict",
            str(work / export),
            "--rows",
            str(ROWS),
            "--batch-size",
            str(BATCH),
            "--seed",
            str(SEED),
            "-o",
            str(output),
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.startswith(f"wrote {ROWS} predictions to {output} in ")
    with open(output, newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows[0] == ["id", "click"]
    return rows[1:]


def test_fp32_export_predicts_exactly_what_the_trained_model_scores(work: Path, capsys) -> None:
    assert predicted(work, "fp32", capsys) == reference_scores(work)


@pytest.mark.parametrize("export", ["fp16", "int8", "mixed", "bf16"])
def test_quantized_exports_stay_within_the_stated_bounds(work: Path, export: str, capsys) -> None:
    expected = torch.tensor([float(row[1]) for row in reference_scores(work)])
    actual = torch.tensor([float(row[1]) for row in predicted(work, export, capsys)])
    assert 0 < float((actual - expected).abs().max()) <= BOUNDS[export]


def test_longer_sequences_are_cut_as_in_training(work: Path) -> None:
    """Histories and pages past max_length: the export keeps the same side as training (fp32: exactly)."""
    module, model = trained_model(work)
    _, served = load(work / "fp32")
    gen = torch.Generator().manual_seed(3)
    batch = 4
    lengths = {"user": [1] * batch, "item": [1] * batch, "history": [9, 6, 0, 13], "pages": [7, 2, 11, 5]}
    rows = {"user": 60, "item": 80, "history": 80, "pages": 30}
    keys = list(lengths)
    values = torch.cat([torch.randint(0, rows[k], (sum(lengths[k]),), generator=gen) for k in keys])
    sparse = KeyedJaggedTensor(keys, values, lengths=torch.tensor([n for k in keys for n in lengths[k]]))
    dense = {"num": torch.randn(batch, 4, generator=gen)}
    with torch.no_grad():
        expected = model(dense, sparse)["click"]
        actual = served(dense, sparse)["click"]
    assert torch.equal(actual, expected)


def test_the_manifest_and_layout_name_the_sequence_tables(work: Path, capsys) -> None:
    manifest = json.loads((work / "mixed" / "manifest.json").read_text())
    assert [(t["name"], t["lookup"], t["precision"], t["row_bytes"]) for t in manifest["tables"]] == [
        ("user", "pooled", "int4", 8),
        ("items", "rows", "fp16", 16),
        ("pages", "rows", "int8", 20),
    ]
    assert manifest["aot"] is None
    layout = json.loads((work / "mixed" / "layout.json").read_text())
    assert [t["name"] for t in layout["tables"]] == ["user"]
    assert [(t["name"], t["pooling"], t["features"]) for t in layout["sequence"]["tables"]] == [
        ("items", "none", [{"name": "item"}, {"name": "history"}]),
        ("pages", "none", [{"name": "pages"}]),
    ]
    code = main(["export", str(work / "seq.yaml"), "--checkpoint", str(work / "ckpt"), "-o", str(work / "again")])
    assert code == 0
    assert "no seq_rec.pt2: torch.export cannot trace sequence lookups; serve the module" in capsys.readouterr().out
    module, model = load(work / "mixed")
    assert type(model.sequence_arch).__name__ == "QuantEmbeddingCollection"
    assert model.sequence_arch.precisions() == {"items": "fp16", "pages": "int8"}


HSTU_SPEC = """\
version: 1
name: hstu_rec
features:
  sparse:
    - {name: item, table: items}
    - {name: history, table: items, pooling: none, max_length: 8}
  timestamps:
    - {name: history_time, sequence: history}
tables:
  - {name: items, num_embeddings: 80, dim: 8}
model:
  recent: {type: hstu, input: sparse.history, timestamps: timestamps.history_time, num_heads: 2,
           attention_dim: 4, linear_dim: 4, num_buckets: 16}
  last: {type: sequence_pool, input: recent, mode: last}
  top: {type: mlp, input: [sparse.item, last], layers: [8, 1], final_activation: none}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 32
  dense_optimizer: {type: adagrad, lr: 0.05}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}
"""


@pytest.mark.parametrize("dim", [8, 10])  # 10: trained on the dense kernel, served padded to 12 columns
def test_an_hstu_model_with_timestamps_and_only_sequence_tables_predicts_exactly(
    tmp_path: Path, capsys, dim: int
) -> None:
    (tmp_path / "hstu.yaml").write_text(
        HSTU_SPEC.replace(
            "{name: items, num_embeddings: 80, dim: 8}", f"{{name: items, num_embeddings: 80, dim: {dim}}}"
        )
    )
    assert (
        main(
            [
                "train",
                str(tmp_path / "hstu.yaml"),
                "--steps",
                "2",
                "--batch-size",
                str(BATCH),
                "--log-every",
                "2",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--checkpoint-every",
                "2",
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
                str(tmp_path / "hstu.yaml"),
                "--checkpoint",
                str(tmp_path / "ckpt"),
                "-o",
                str(tmp_path / "fp32"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    _, model = load(tmp_path / "fp32")
    assert not hasattr(model, "sparse_arch")
    assert predicted(tmp_path, "fp32", capsys) == reference_scores(tmp_path, "hstu_rec")


def test_a_checkpoint_of_two_ranks_exports_what_one_process_scores_with_it(tmp_path: Path, capsys) -> None:
    """Sequence tables sharded over 2 gloo ranks in training (the planner picks row_wise for both): the
    export reads them whole, and fp32
    predicts exactly what the training module scores in one process with the checkpoint loaded."""
    (tmp_path / "seq.yaml").write_text(SPEC)
    assert (
        main(
            [
                "train",
                str(tmp_path / "seq.yaml"),
                "--nproc",
                "2",
                "--steps",
                "2",
                "--batch-size",
                str(BATCH),
                "--log-every",
                "2",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--checkpoint-every",
                "2",
                "-o",
                str(tmp_path / "build"),
            ]
        )
        == 0
    )
    assert (
        main(
            ["export", str(tmp_path / "seq.yaml"), "--checkpoint", str(tmp_path / "ckpt"), "-o", str(tmp_path / "fp32")]
        )
        == 0
    )
    assert json.loads((tmp_path / "fp32" / "manifest.json").read_text())["checkpoint"]["world_size"] == 2
    # The reference runs in one process: the training module compiled for world size 1.
    assert main(["compile", str(tmp_path / "seq.yaml"), "--world-size", "1", "-o", str(tmp_path / "build")]) == 0
    capsys.readouterr()
    assert predicted(tmp_path, "fp32", capsys) == reference_scores(tmp_path)
