"""A two-tower retrieval model on a raw CSV with learned vocabularies: train -> export -> retrieve.

The item catalogue is the item feature's learned vocabulary (its OOV row and
the table's unused rows are no items), and `retrieve` writes the raw string
ids (`m12`), not table rows. The reference is a brute-force ranking from the
exported model's own towers: every request's query vector against every
vocabulary value's item vector, mapped back to its string through
features.json.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import random
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.learn import with_learned
from runtime.serving.export_dir import load
from runtime.serving.samples import file_samples

K = 5
SPEC = """\
version: 1
name: learned_retrieval
features:
  sparse:
    - {name: user, num_embeddings: auto, dim: 8, vocabulary: {max_size: 100}}
    - {name: movie, num_embeddings: 64, dim: 8, vocabulary: {min_count: 2, oov_buckets: 2}}
    - {name: job, num_embeddings: auto, dim: 4, vocabulary: {max_size: 8}}
model:
  user_tower:  {type: mlp, input: [sparse.user, sparse.job], layers: [8], final_activation: none}
  movie_tower: {type: mlp, input: sparse.movie, layers: [8], final_activation: none}
heads:
  - {name: match, loss: sampled_softmax, input: user_tower, item: movie_tower, negatives: {in_batch: true},
     normalize: true}
training:
  batch_size: 32
  seed: 1
  dense_optimizer:  {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
data:
  reader: csv
  path: train.csv
  columns: {user: user, movie: movie, job: job}
"""


def _run(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0, args
    return out.getvalue()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("learned_retrieval")
    rng = random.Random(0)
    lines = ["user,movie,job"]
    for i in range(600):  # user u likes movies of its group (u mod 3); m100.. are seen once (below min_count)
        user = rng.randrange(30)
        movie = rng.choice([m for m in range(30) if m % 3 == user % 3]) if rng.random() < 0.9 else 100 + i
        lines.append(f"u{user},m{movie},j{user % 4}")
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    (root / "requests.csv").write_text("user,movie,job\nu1,m1,j1\nu2,m2,j2\nu99,,j0\nu4,m40,zz\n")
    (root / "spec.yaml").write_text(SPEC)
    spec = str(root / "spec.yaml")
    _run(
        "train",
        spec,
        "--data",
        f"csv:{root}/train.csv",
        "--steps",
        "40",
        "--data-workers",
        "0",
        "--checkpoint-dir",
        str(root / "ckpt"),
        "-o",
        str(root / "build"),
    )
    _run("export", spec, "--checkpoint", str(root / "ckpt"), "--quantize", "none", "--no-aot", "-o", str(root / "out"))
    _run(
        "retrieve", str(root / "out"), "--data", f"csv:{root}/requests.csv", "--k", str(K), "-o", str(root / "top.csv")
    )
    return root


def test_the_catalogue_is_the_learned_vocabulary_not_the_table(work: Path) -> None:
    manifest = json.loads((work / "out" / "manifest.json").read_text())
    features = json.loads((work / "out" / "features.json").read_text())["features"]["movie"]["state"]
    assert features["oov_buckets"] == 2
    assert manifest["retrieval"]["items"] == len(features["values"]) < 64  # no OOV rows, no unused rows
    assert manifest["retrieval"]["item_ids"] == "vocabulary"
    assert sorted(features["values"]) == sorted(f"m{m}" for m in range(30))  # m100.. seen once: below min_count


def test_retrieve_writes_raw_ids_in_the_order_of_a_brute_force_ranking_of_the_towers(work: Path) -> None:
    module, model = load(work / "out")
    inputs = with_learned(module.INPUTS, work / "out" / "features.json")
    state = inputs.learned.get("movie").state
    rows = torch.arange(len(state.values)) + state.oov_buckets
    with torch.inference_mode():
        items = model.item_vectors(rows)
        reader = open_reader(inputs, DataChoice("csv", str(work / "requests.csv")))
        ((_, batch),) = list(file_samples(reader, 16, BadRowLog("fail")))
        queries = model.query_vectors(batch.dense, batch.sparse)
    expected = [[state.values[i] for i in (q @ items.T).topk(K).indices.tolist()] for q in queries]
    with open(work / "top.csv") as stream:
        got: dict[int, list[str]] = {}
        for row in csv.DictReader(stream):
            got.setdefault(int(row["line"]), []).append(row["item"])
    assert [got[line] for line in (2, 3, 4, 5)] == expected
    assert all(item.startswith("m") for ranked in expected for item in ranked)
