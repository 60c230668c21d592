"""Every published model of specs/zoo/ exports and predicts: train -> checkpoint -> export -> predict.

Each zoo spec is trained for two small steps, exported in fp32 and scored by
`reccompile predict` on the spec's synthetic data (a retrieval model, which
predict does not score, gives the trained module's query and item vectors). The reference is the
training module in eval mode with the checkpoint loaded, its outputs turned
into scores as the export does (`head_scores`), written with 9 significant
digits as predict writes them; fp32 serving runs the same kernels in the same
order, so the two CSVs must be equal. Where the export has a `.pt2`, the
program gives the served module's outputs on batches of 5 and of 1 (aten's
linears against oneDNN's: within 1e-5).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.serving.export_dir import head_scores, load
from runtime.serving.predict import score_columns
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module
from tests.model_specs import REPO, SPECS

ZOO = [spec for spec in SPECS if spec.startswith("specs/zoo/")]
ROWS, BATCH, SEED = 40, 20, 5


def _expected(build: Path, checkpoint: Path) -> list[list[str]]:
    """The scores of the eval-mode training module with the checkpoint loaded, as CSV rows under their header."""
    (source,) = build.glob("*.py")  # the one module `reccompile train` compiled
    module = load_module(str(source))
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    load_checkpoint(checkpoint, model, optimizer, spec_sha256=module.SPEC_SHA256)
    model.eval()
    rows = [["id", *score_columns(module.HEADS)]]
    with torch.no_grad():
        for step, start in enumerate(range(0, ROWS, BATCH)):
            batch = module.synthetic_batch(BATCH, step=step, seed=SEED)
            scores = head_scores(model(batch.dense, batch.sparse), module.HEADS)
            columns = [scores[head.name].reshape(BATCH, -1) for head in module.HEADS]
            values = torch.cat(columns, dim=1).tolist()
            rows += [[str(start + i), *(f"{v:.9g}" for v in row)] for i, row in enumerate(values)]
    return rows


def _check_towers(directory: Path, build: Path, checkpoint: Path) -> None:
    """A retrieval model's fp32 export gives exactly the query and item vectors of the trained module."""
    (source,) = build.glob("*.py")
    module = load_module(str(source))
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    load_checkpoint(checkpoint, model, optimizer, spec_sha256=module.SPEC_SHA256)
    model.eval()
    _, served = load(directory)
    batch = module.synthetic_batch(BATCH, step=0, seed=SEED)
    rows = torch.arange(64)
    with torch.no_grad():
        queries = served.query_vectors(batch.dense, batch.sparse)
        assert torch.equal(queries, model.query_vectors(batch.dense, batch.sparse))
        assert torch.equal(served.item_vectors(rows), model.item_vectors(rows))


@pytest.mark.parametrize("spec", ZOO, ids=[Path(spec).stem for spec in ZOO])
def test_a_zoo_model_exports_in_fp32_and_predicts_its_eval_scores(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(REPO / spec)
    assert (
        main(
            [
                "train",
                path,
                "--steps",
                "2",
                "--batch-size",
                "32",
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
            ["export", path, "--checkpoint", str(tmp_path / "ckpt"), "--quantize", "none", "-o", str(tmp_path / "fp32")]
        )
        == 0
    )
    manifest = json.loads((tmp_path / "fp32" / "manifest.json").read_text())
    if "retrieval" in manifest:  # `predict` scores no samples of a retrieval model: its towers are checked
        _check_towers(tmp_path / "fp32", tmp_path / "build", tmp_path / "ckpt")
        return
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
    assert rows == _expected(tmp_path / "build", tmp_path / "ckpt")
    if manifest.get("aot"):
        for size in (5, 1):
            _check_program(tmp_path / "fp32", manifest["aot"], tmp_path / "build", size)


def _check_program(directory: Path, aot: dict, build: Path, size: int) -> None:
    """The .pt2 program against the served module on one synthetic batch of `size` samples."""
    program = torch.export.load(directory / aot["file"]).module()
    _, model = load(directory)
    (source,) = build.glob("*.py")
    batch = load_module(str(source)).synthetic_batch(size, step=1, seed=SEED)
    features = [batch.sparse[key] for key in aot["sparse_keys"]]
    values = torch.cat([f.values() for f in features])
    lengths = torch.cat([f.lengths() for f in features])
    weighted = aot["inputs"]["weights"] is not None
    weights = torch.cat([f.weights() for f in features]) if weighted else None
    with torch.no_grad():
        served = model(batch.dense, batch.sparse)
        got = program(batch.dense, values, lengths, weights)
    assert got.keys() == served.keys()
    for head, output in served.items():
        torch.testing.assert_close(got[head], output, rtol=1e-5, atol=1e-6, msg=lambda m: f"{head}, batch {size}: {m}")
