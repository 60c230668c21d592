"""`reccompile serve --pipeline` on your own CSV: learned vocabularies, raw ids in and out.

The table has the own-data example's header (specs/examples/movielens_csv.yaml)
and string ids (`u3`, `m12`, `j1`). The retrieval spec learns its movie
vocabulary with `min_count: 2` and two OOV rows, the ranking spec its own
with every movie and one OOV row, so a movie's table row differs between
the two models: a pipeline that fed the ranking model the retrieval's rows
would score other movies. The reference is offline: `reccompile retrieve`
writes each user's top K raw ids, `reccompile predict` scores every (user,
candidate) line of a CSV, and the best N by that score (ties in retrieval
order) must be what the server answers, as raw ids.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serving_client import Server, started_server

from compiler.cli import main

K, N = 6, 3
HEADER = "user,movie,genres,age,gender,occupation,zip,year,ts,label"
COMMON = """\
training:
  batch_size: 32
  seed: 2
  dense_optimizer:  {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
"""
RETRIEVAL = (
    """\
version: 1
name: own_retrieval
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
data:
  reader: csv
  path: train.csv
  columns: {user: user, movie: movie, occupation: job}
"""
    + COMMON
)
RANKING = (
    """\
version: 1
name: own_ranking
features:
  sparse:
    - {name: user, num_embeddings: auto, dim: 8, vocabulary: {max_size: 100}}
    - {name: movie, num_embeddings: 200, dim: 8, vocabulary: {}}
    - {name: job, num_embeddings: auto, dim: 4, vocabulary: {max_size: 8}}
model:
  top: {type: mlp, input: [sparse.user, sparse.movie, sparse.job], layers: [16, 1], final_activation: none}
heads:
  - {name: like, input: top, loss: bce}
data:
  reader: csv
  path: train.csv
  columns: {user: user, movie: movie, occupation: job, label: like}
"""
    + COMMON
)
ASKED = [("u1", "j1"), ("u5", "j1"), ("u8", "j0"), ("u77", "j3")]  # u77: never seen, its OOV row


def _run(*args: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(list(args)) == 0, args


def _line(user: str, movie: str, job: str, label: int = 0) -> str:
    return f"{user},{movie},Drama|Comedy,30,F,{job},12345,1995,{1000 + len(user)},{label}"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("own_pipeline")
    rng = random.Random(0)
    lines = [HEADER]
    for i in range(500):  # user u likes its group's movies (u mod 3); m100.. once each (below min_count 2)
        user = rng.randrange(24)
        movie = rng.choice([m for m in range(24) if m % 3 == user % 3]) if rng.random() < 0.9 else 100 + i
        lines.append(_line(f"u{user}", f"m{movie}", f"j{user % 4}", int(rng.random() < 0.6)))
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    for name, text in (("retrieval", RETRIEVAL), ("ranking", RANKING)):
        spec = root / f"{name}.yaml"
        spec.write_text(text)
        ckpt, out = root / f"{name}_ckpt", root / f"{name}_out"
        train = ["train", str(spec), "--data", f"csv:{root}/train.csv", "--steps", "30", "--data-workers", "0"]
        _run(*train, "--checkpoint-dir", str(ckpt), "-o", str(root / f"{name}_build"))
        _run("export", str(spec), "--checkpoint", str(ckpt), "--quantize", "none", "--no-aot", "-o", str(out))
    return root


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


@pytest.fixture(scope="module")
def offline(work: Path) -> dict[str, Any]:
    """retrieve's top K raw ids per asked user, then predict's score of each (user, candidate), best N kept."""
    requests = work / "requests.csv"
    requests.write_text("\n".join([HEADER, *(_line(user, "", job) for user, job in ASKED)]) + "\n")
    _run(
        "retrieve", str(work / "retrieval_out"), "--data", f"csv:{requests}", "--k", str(K), "-o", str(work / "top.csv")
    )
    retrieved: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for row in _csv(work / "top.csv"):
        retrieved[int(row["line"]) - 2].append((row["item"], float(row["score"])))
    pairs = [(asked, item) for asked in range(len(ASKED)) for item, _ in retrieved[asked]]
    lines = [_line(ASKED[asked][0], item, ASKED[asked][1]) for asked, item in pairs]
    (work / "pairs.csv").write_text("\n".join([HEADER, *lines]) + "\n")
    _run("predict", str(work / "ranking_out"), "--data", f"csv:{work / 'pairs.csv'}", "-o", str(work / "ranked.csv"))
    scores = [float(row["like"]) for row in _csv(work / "ranked.csv")]
    ranked = []
    for asked in range(len(ASKED)):
        mine = [
            (score, rank, item) for rank, ((a, item), score) in enumerate(zip(pairs, scores, strict=True)) if a == asked
        ]
        best = sorted(mine, key=lambda t: (-t[0], t[1]))[:N]
        ranked.append(([item for _, _, item in best], [score for score, _, _ in best]))
    return {"retrieved": retrieved, "ranked": ranked}


@pytest.fixture(scope="module")
def server(work: Path) -> Any:
    args = [work / "retrieval_out", "--pipeline", work / "retrieval_out", work / "ranking_out", "--k", K, "--n", N]
    with started_server(args) as running:
        yield running


def _asked() -> dict[str, Any]:
    return {
        "inputs": [
            {"name": column, "datatype": "BYTES", "shape": [len(ASKED)], "data": [asked[i] for asked in ASKED]}
            for i, column in enumerate(("user", "occupation"))
        ]
    }


def test_the_two_models_number_the_movies_differently(work: Path) -> None:
    def rows(name: str) -> dict[str, int]:
        state = json.loads((work / name / "features.json").read_text())["features"]["movie"]["state"]
        return {value: state["oov_buckets"] + k for k, value in enumerate(state["values"])}

    retrieval, ranking = rows("retrieval_out"), rows("ranking_out")
    assert set(retrieval) < set(ranking)
    assert sum(retrieval[m] != ranking[m] for m in retrieval) > len(retrieval) // 2


def test_the_pipeline_answers_raw_ids_as_offline_retrieve_then_predict(server: Server, offline) -> None:
    status, _, body = server.call("GET", "/v2/models/own_retrieval_then_own_ranking")
    assert status == 200, body
    assert body["inputs"] == [
        {"name": "user", "datatype": "BYTES", "shape": [-1]},
        {"name": "occupation", "datatype": "BYTES", "shape": [-1]},
    ]
    assert body["outputs"][0] == {"name": "items", "datatype": "BYTES", "shape": [-1, N]}
    status, _, body = server.call("POST", "/v2/models/own_retrieval_then_own_ranking/infer", _asked())
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["items"]["datatype"] == "BYTES" and outputs["items"]["shape"] == [len(ASKED), N]
    items = np.array(outputs["items"]["data"]).reshape(len(ASKED), N)
    scores = np.array(outputs["scores"]["data"]).reshape(len(ASKED), N)
    for row, (expected_items, expected_scores) in enumerate(offline["ranked"]):
        assert items[row].tolist() == expected_items
        assert np.allclose(scores[row], expected_scores, rtol=1e-6, atol=1e-6)
    assert all(item.startswith("m") for item in outputs["items"]["data"])


def test_the_retrieval_export_served_alone_answers_retrieves_raw_ids(server: Server, offline) -> None:
    status, _, body = server.call("POST", "/v2/models/own_retrieval/infer", _asked())
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["items"]["datatype"] == "BYTES"
    items = np.array(outputs["items"]["data"]).reshape(len(ASKED), K)
    scores = np.array(outputs["scores"]["data"]).reshape(len(ASKED), K)
    for row in range(len(ASKED)):
        assert items[row].tolist() == [item for item, _ in offline["retrieved"][row]]
        assert np.allclose(scores[row], [score for _, score in offline["retrieved"][row]], rtol=1e-6, atol=1e-6)


def test_binary_outputs_carry_the_raw_ids_as_length_prefixed_bytes(server: Server, offline) -> None:
    body = _asked() | {"outputs": [{"name": "items", "parameters": {"binary_data": True}}]}
    status, headers, raw = server.call("POST", "/v2/models/own_retrieval/infer", body)
    assert status == 200, raw
    data = raw.encode()[int(headers["Inference-Header-Content-Length"]) :]
    expected = [item for row in range(len(ASKED)) for item, _ in offline["retrieved"][row]]
    assert data == b"".join(len(item).to_bytes(4, "little") + item.encode() for item in expected)
