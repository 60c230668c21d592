"""Criteo rows served from raw columns score what `reccompile predict` scores for the same lines.

The spec fans one id column out to two tables and bucketizes the integer
columns (runtime.data.feature_columns), so the served rows must go through
the Criteo reader's parsing and `to_features` as predict's do. An empty
integer field is sent as null, an empty categorical field as "".
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.cli import main
from runtime.serving.online.models import load_model
from runtime.serving.online.protocol import BadRequest, InferRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data"))
from sample_files import criteo_line, write_lines

SPEC = """\
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


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("criteo_rows")
    rng = random.Random(5)
    data = write_lines(root / "day_0.txt", [criteo_line(rng) for _ in range(40)])
    (root / "spec.yaml").write_text(SPEC)
    assert (
        main(
            [
                "train",
                str(root / "spec.yaml"),
                "--data",
                f"criteo:{data}",
                "--data-workers",
                "0",
                "--steps",
                "2",
                "--checkpoint-dir",
                str(root / "ckpt"),
                "-o",
                str(root / "build"),
            ]
        )
        == 0
    )
    assert (
        main(
            ["export", str(root / "spec.yaml"), "--checkpoint", str(root / "ckpt"), "--no-aot", "-o", str(root / "out")]
        )
        == 0
    )
    assert main(["predict", str(root / "out"), "--data", f"criteo:{data}", "-o", str(root / "predicted.csv")]) == 0
    return root


def _fields(lines: list[str]) -> dict[str, list[object]]:
    split = [line.split("\t") for line in lines]
    fields: dict[str, list[object]] = {f"I{i}": [int(s[i]) if s[i] else None for s in split] for i in range(1, 14)}
    fields.update({f"C{i}": [s[13 + i] for s in split] for i in range(1, 27)})
    return fields


def test_served_criteo_rows_score_as_predict(work: Path) -> None:
    model = load_model(work / "out", reader="criteo")
    assert [i.name for i in model.inputs] == [*(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    lines = (work / "day_0.txt").read_text().splitlines()
    with open(work / "predicted.csv", newline="") as stream:
        expected = [float(row[2]) for row in list(csv.reader(stream))[1:]]
    answers = model.predict([InferRequest(_fields(lines[:7]), 7), InferRequest(_fields(lines[7:]), len(lines) - 7)])
    served = [v for outputs, _ in answers for v in outputs[0].data]
    assert np.allclose(served, expected, rtol=1e-6, atol=1e-6)


def test_a_bad_criteo_value_names_its_column_and_row(work: Path) -> None:
    model = load_model(work / "out", reader="criteo")
    lines = (work / "day_0.txt").read_text().splitlines()
    assert any(not line.split("\t")[i] for line in lines for i in range(1, 14))  # some integers are null
    fields = _fields(lines[:2])
    fields["C3"][1] = "xyz"
    (answer,) = model.predict([InferRequest(fields, 2)])
    assert isinstance(answer, BadRequest)
    assert str(answer) == "input 'C3', row 1: not hexadecimal of at most 16 digits (got 'xyz')"


def test_a_bad_row_in_a_batch_refuses_its_request_alone_naming_its_own_row(work: Path) -> None:
    model = load_model(work / "out", reader="criteo")
    lines = (work / "day_0.txt").read_text().splitlines()
    with open(work / "predicted.csv", newline="") as stream:
        expected = [float(row[2]) for row in list(csv.reader(stream))[1:]]
    bad = _fields(lines[3:5])
    bad["C3"][1] = "xyz"  # row 4 of the joined batch, row 1 of its request
    requests = [
        InferRequest(_fields(lines[:3]), 3),
        InferRequest(bad, 2),
        InferRequest(_fields(lines[5:]), len(lines) - 5),
    ]
    first, refused, last = model.predict(requests)
    assert isinstance(refused, BadRequest)
    assert str(refused) == "input 'C3', row 1: not hexadecimal of at most 16 digits (got 'xyz')"
    served = [v for outputs, _ in (first, last) for v in outputs[0].data]
    assert np.allclose(served, expected[:3] + expected[5:], rtol=1e-6, atol=1e-6)
