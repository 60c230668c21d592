"""`reccompile predict --data criteo:FILE`: one CSV row per good line, bad rows as in training.

A tiny Criteo-shaped model is trained on a Criteo file, exported at int8 and
asked to score the same file with two malformed lines in it.
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

import pytest
import torch

from compiler.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime" / "data"))
from sample_files import criteo_line, write_lines  # noqa: E402

SPEC = """\
version: 1
name: tiny_criteo
features:
  dense:
    - {name: int, size: 13}
  sparse:
    - {name: cat, count: 26, num_embeddings: 500, dim: 8}
model:
  bottom: {type: mlp, input: dense.int, layers: [16, 8]}
  interaction: {type: dot, input: [bottom, sparse.*]}
  top: {type: mlp, input: [bottom, interaction], layers: [16, 1], final_activation: none}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 64
  dense_optimizer: {type: adagrad, lr: 0.05}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
"""
LINES = 150
BAD = {7: "C3", 120: None}  # line number -> the bad column (None: the field count)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    root = tmp_path_factory.mktemp("predict")
    rng = random.Random(4)
    lines = [criteo_line(rng) for _ in range(LINES)]
    fields = lines[6].split("\t")
    fields[16] = "xyz"  # C3
    lines[6] = "\t".join(fields)
    lines[119] = lines[119].rsplit("\t", 1)[0]
    data = write_lines(root / "day_0.txt", lines)
    spec = root / "tiny.yaml"
    spec.write_text(SPEC)
    assert (
        main(
            [
                "train",
                str(spec),
                "--data",
                f"criteo:{data}",
                "--bad-rows",
                "skip",
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
                "int8",
                "--no-aot",
                "-o",
                str(root / "out"),
            ]
        )
        == 0
    )
    return root, data, lines


def test_predict_writes_file_and_line_of_every_good_row_and_skips_bad_ones(exported, capsys) -> None:
    root, data, lines = exported
    capsys.readouterr()
    output = root / "predictions.csv"
    code = main(
        [
            "predict",
            str(root / "out"),
            "--data",
            f"criteo:{data}",
            "--bad-rows",
            "skip",
            "--batch-size",
            "32",
            "-o",
            str(output),
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"wrote {LINES - 2} predictions to {output} in ")
    assert out.endswith("; 2 bad rows skipped\n")
    assert f"warning: skipped bad row {data}:7: column C3: " in err
    assert f"warning: skipped bad row {data}:120: 39 tab-separated fields, expected 40" in err
    assert f"skipped 2 bad rows of {LINES} read; the first:" in err
    with open(output, newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows[0] == ["file", "line", "click"]
    assert [int(row[1]) for row in rows[1:]] == [n for n in range(1, LINES + 1) if n not in BAD]
    assert {row[0] for row in rows[1:]} == {str(data)}
    assert all(0.0 < float(row[2]) < 1.0 for row in rows[1:])


def test_one_row_is_one_prediction_and_one_bad_row(exported, capsys) -> None:
    root, data, _ = exported
    lines = data.read_text().splitlines(keepends=True)
    two = root / "two_lines.txt"
    two.write_text(lines[0] + lines[6])  # the first row, and line 7, a bad one
    output = root / "one.csv"
    capsys.readouterr()
    assert main(["predict", str(root / "out"), "--data", f"criteo:{two}", "--bad-rows", "skip", "-o", str(output)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote 1 prediction to {output} in ") and out.endswith("; 1 bad row skipped\n")


def test_the_first_bad_row_stops_prediction_by_default(exported, capsys) -> None:
    root, data, lines = exported
    capsys.readouterr()
    output = root / "stopped.csv"
    assert main(["predict", str(root / "out"), "--data", f"criteo:{data}", "-o", str(output)]) == 1
    assert capsys.readouterr().err == (
        f"error: {data}:7: column C3: not hexadecimal of at most 16 digits (value 'xyz'); "
        "pass --bad-rows skip to count and skip bad rows instead\n"
    )
    assert not output.exists()


@pytest.mark.parametrize(
    ("idle", "options", "used", "said"),
    [
        (1.1, [], 1, "1 thread (1 of 2 cores free)"),  # a busy neighbour: one thread, not torch's two
        (2.0, [], 2, "2 threads (2 of 2 cores free)"),
        (0.3, ["--threads", "3"], 3, "3 threads (--threads; 2 cores usable)"),  # the user's number stands
    ],
)
def test_predict_takes_the_free_cores_unless_told_and_says_so(
    exported, capsys, two_cores, idle: float, options: list[str], used: int, said: str
) -> None:
    root, data, lines = exported
    two_cores(idle)
    capsys.readouterr()
    output = root / "threads.csv"
    assert (
        main(
            [
                "predict",
                str(root / "out"),
                "--data",
                f"criteo:{data}",
                "--bad-rows",
                "skip",
                *options,
                "-o",
                str(output),
            ]
        )
        == 0
    )
    assert torch.get_num_threads() == used
    assert capsys.readouterr().out.split(" rows/s in the model) ", 1)[1] == f"on {said}; 2 bad rows skipped\n"
