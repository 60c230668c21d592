"""`reccompile predict --data movielens:FILE` maps ids with the vocabulary training used.

A tiny two-tower model is trained on one ratings file (its vocabulary built
from it), checkpointed, exported and asked to score a held-out file whose
movies are a different set (some never seen in training). The training
model's own scores of the held-out rows, with the training vocabulary, are
the reference: predict must give the same numbers. Mapping the held-out
file through a vocabulary built from itself (what predict did before the
export carried vocab.json) gives other numbers. The held-out movies that
training never saw are counted by every evaluation pass and by predict.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_model_state
from runtime.data.movielens.vocab import read_vocabulary
from runtime.data.sources import choose_data, open_reader
from runtime.serving.export_dir import load
from runtime.serving.predict import predict_file
from runtime.train.worker import load_module

SPEC = """\
version: 1
name: tiny_movielens
features:
  sparse:
    - {name: user_id, num_embeddings: 40, dim: 8}
    - {name: movie_id, table: movie}
tables:
  - {name: movie, num_embeddings: 60, dim: 8}
model:
  user_tower: {type: mlp, input: sparse.user_id, layers: [8], final_activation: none}
  item_tower: {type: mlp, input: sparse.movie_id, layers: [8], final_activation: none}
  score: {type: dot_product, input: [user_tower, item_tower]}
heads:
  - {name: like, input: score, loss: bce}
training:
  batch_size: 32
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
"""


def _ratings(path: Path, movies: range, count: int, seed: int) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True)
    lines = [f"{rng.randint(1, 30)}\t{rng.choice(movies)}\t{rng.randint(1, 5)}\t{880000000 + i}" for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("movielens")
    (root / "tiny.yaml").write_text(SPEC)
    _ratings(root / "train" / "u.data", range(1, 51), 400, seed=1)
    _ratings(root / "test" / "u.data", range(20, 56), 120, seed=2)  # movies 51..55: never trained
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert (
            main(
                [
                    "train",
                    str(root / "tiny.yaml"),
                    "--data",
                    f"movielens:{root / 'train'}",
                    "--eval-data",
                    f"movielens:{root / 'test'}",
                    "--eval-every",
                    "3",
                    "--data-workers",
                    "0",
                    "--steps",
                    "6",
                    "--log-every",
                    "6",
                    "--checkpoint-dir",
                    str(root / "ckpt"),
                    "--checkpoint-every",
                    "6",
                    "-o",
                    str(root / "build"),
                ]
            )
            == 0
        )
    (root / "train.out").write_text(output.getvalue())
    assert (
        main(
            ["export", str(root / "tiny.yaml"), "--checkpoint", str(root / "ckpt"), "--no-aot", "-o", str(root / "out")]
        )
        == 0
    )
    return root


def _training_scores(root: Path) -> list[float]:
    """The trained model's scores of the held-out rows, ids mapped as in training."""
    module = load_module(str(root / "build" / "tiny_movielens.py"))
    model = module.build()
    model.load_state_dict(load_model_state(root / "ckpt"), strict=False)
    model.eval()
    vocabulary = read_vocabulary(root / "build" / "tiny_movielens.vocab.json")
    reader = open_reader(module.INPUTS, choose_data(f"movielens:{root / 'test'}", module.INPUTS), vocabulary=vocabulary)
    rows = [reader.parse(line) for _, _, line in reader.epoch_lines()]
    batch = reader.to_columns(rows).to_batch(reader.weighted)
    with torch.no_grad():
        return torch.sigmoid(model(batch.dense, batch.sparse)["like"]).reshape(-1).tolist()


def _unseen_movies(root: Path) -> int:
    """The reference count: held-out rows whose movie id is not in the training file."""
    trained = {line.split("\t")[1] for line in (root / "train" / "u.data").read_text().splitlines()}
    return sum(line.split("\t")[1] not in trained for line in (root / "test" / "u.data").read_text().splitlines())


UNSEEN = "ids not in the training vocabulary (row 0): user_id 0, movie_id 19 of 120 rows"


def _predicted(path: Path) -> list[float]:
    with open(path, newline="") as stream:
        return [float(row[2]) for row in list(csv.reader(stream))[1:]]


def test_the_export_carries_the_training_vocabulary(trained: Path) -> None:
    manifest = json.loads((trained / "out" / "manifest.json").read_text())
    assert manifest["vocabulary"]["file"] == "vocab.json"
    assert (trained / "out" / "vocab.json").read_bytes() == (
        trained / "ckpt" / "step_00000006" / "vocab.json"
    ).read_bytes()
    assert read_vocabulary(trained / "out" / "vocab.json") == read_vocabulary(
        trained / "build" / "tiny_movielens.vocab.json"
    )


def test_predict_scores_equal_the_training_models_scores(trained: Path) -> None:
    output = trained / "predictions.csv"
    code = main(["predict", str(trained / "out"), "--data", f"movielens:{trained / 'test'}", "-o", str(output)])
    assert code == 0
    expected = _training_scores(trained)
    assert len(expected) == 120
    assert _predicted(output) == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_a_vocabulary_of_the_scored_file_gives_other_scores(trained: Path) -> None:
    module, model = load(trained / "out")
    output = trained / "own_vocabulary.csv"
    predict_file(model, module.INPUTS, output, data=f"movielens:{trained / 'test'}", batch_size=512, rows=0, seed=0)
    assert _predicted(output) != pytest.approx(_training_scores(trained), rel=1e-6, abs=1e-7)


def test_every_evaluation_pass_and_the_result_count_the_unseen_ids(trained: Path) -> None:
    assert _unseen_movies(trained) == 19
    lines = (trained / "train.out").read_text().splitlines()
    evals = [line for line in lines if line.startswith("eval ")]
    assert [line[:12] for line in evals] == ["eval     3/6", "eval     6/6"]  # counted afresh by each pass
    assert all(line.endswith(f"  {UNSEEN}") for line in evals)
    assert lines[-2] == "training data: ids not in the training vocabulary (row 0): user_id 0, movie_id 0 of 192 rows"
    result = json.loads(lines[-1])
    assert result["unseen_ids"] == {"user_id": 0, "movie_id": 0}
    assert result["eval_unseen_ids"] == {"user_id": 0, "movie_id": 19}


def test_predict_counts_the_ids_training_never_saw(trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = trained / "counted.csv"
    assert main(["predict", str(trained / "out"), "--data", f"movielens:{trained / 'test'}", "-o", str(output)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"wrote 120 predictions to {output} in ")
    assert line.endswith(f"; 0 bad rows skipped; {UNSEEN}")


def test_a_resumed_run_maps_ids_with_the_checkpoints_vocabulary(trained: Path, tmp_path: Path) -> None:
    # Resumed on another file, the tables' rows still mean the ids of the first: a vocabulary
    # rebuilt from the new file would move every id to another row without a word.
    shutil.copytree(trained / "ckpt", tmp_path / "ckpt")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert (
            main(
                [
                    "train",
                    str(trained / "tiny.yaml"),
                    "--data",
                    f"movielens:{trained / 'test'}",
                    "--data-workers",
                    "0",
                    "--steps",
                    "9",
                    "--log-every",
                    "9",
                    "--checkpoint-dir",
                    str(tmp_path / "ckpt"),
                    "--resume",
                    "-o",
                    str(tmp_path / "build"),
                ]
            )
            == 0
        )
    first = read_vocabulary(trained / "build" / "tiny_movielens.vocab.json")
    assert read_vocabulary(tmp_path / "build" / "tiny_movielens.vocab.json") == first
    assert read_vocabulary(tmp_path / "ckpt" / "step_00000009" / "vocab.json") == first
    result = json.loads(output.getvalue().splitlines()[-1])
    assert result["unseen_ids"]["movie_id"] > 0  # the held-out file's new movies, counted
