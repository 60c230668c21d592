"""`reccompile serve --pipeline`: MovieLens retrieval then ranking in one request equals retrieve, then predict.

A MovieLens-format ratings file (movie ids 1000 + 7k, not table rows) trains
a two-tower retrieval spec (sampled softmax, exact index) and a ranking spec
over the same columns (a bce head on the rating). The reference is offline:
`reccompile retrieve` gives each user's top K, `reccompile predict` scores
every (user, candidate) line, and the best N by that score (ties in
retrieval order) must be what the server answers for the user's raw userId.
The retrieval export served alone must answer `retrieve`'s items and scores.
"""

from __future__ import annotations

import csv
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serving_client import Server, started_server

from compiler.cli import main

USERS, MOVIES, K, N = 24, 16, 8, 3
COMMON = f"""\
features:
  sparse:
    - {{name: user_id, num_embeddings: {USERS + 1}, dim: 8}}
    - {{name: movie_id, num_embeddings: {MOVIES + 1}, dim: 8}}
training:
  batch_size: 32
  seed: 3
  dense_optimizer: {{type: adam, lr: 0.01}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
"""
RETRIEVAL = (
    """\
version: 1
name: tiny_retrieval
model:
  user_tower: {type: mlp, input: sparse.user_id, layers: [16, 8], final_activation: none}
  item_tower: {type: mlp, input: sparse.movie_id, layers: [16, 8], final_activation: none}
heads:
  - name: match
    loss: sampled_softmax
    input: user_tower
    item: item_tower
    negatives: {in_batch: true}
    normalize: true
"""
    + COMMON
)
RANKING = (
    """\
version: 1
name: tiny_ranking
model:
  top: {type: mlp, input: [sparse.user_id, sparse.movie_id], layers: [16, 1], final_activation: none}
heads:
  - {name: like, input: top, loss: bce}
"""
    + COMMON
)
ASKED = [3, 7, 11, 20]  # the users asked for


def _write_ratings(path: Path) -> Path:
    rng = random.Random(1)
    lines = [
        f"{user}::{1000 + 7 * movie}::{rng.randint(1, 5)}::{100 * user + movie}"
        for user in range(1, USERS + 1)
        for movie in rng.sample(range(MOVIES), 8)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _train_and_export(root: Path, name: str, text: str, ratings: Path, *export: str) -> Path:
    (root / f"{name}.yaml").write_text(text)
    assert (
        main(
            [
                "train",
                str(root / f"{name}.yaml"),
                "--data",
                f"movielens:{ratings}",
                "--data-workers",
                "0",
                "--steps",
                "5",
                "--log-every",
                "5",
                "--checkpoint-dir",
                str(root / f"{name}_ckpt"),
                "-o",
                str(root / f"{name}_build"),
            ]
        )
        == 0
    )
    out = root / f"{name}_out"
    assert (
        main(
            [
                "export",
                str(root / f"{name}.yaml"),
                "--checkpoint",
                str(root / f"{name}_ckpt"),
                "--no-aot",
                *export,
                "-o",
                str(out),
            ]
        )
        == 0
    )
    return out


def _csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as stream:
        return list(csv.reader(stream))[1:]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pipeline")
    ratings = _write_ratings(root / "ratings.dat")
    _train_and_export(root, "retrieval", RETRIEVAL, ratings, "--index", "exact")
    _train_and_export(root, "ranking", RANKING, ratings)
    return root


@pytest.fixture(scope="module")
def offline(work: Path) -> dict[str, Any]:
    """retrieve's top K per asked user, then predict's score of each (user, candidate), best N kept."""
    requests = work / "requests.dat"
    requests.write_text("".join(f"{user}::1000::5::0\n" for user in ASKED))
    assert (
        main(
            [
                "retrieve",
                str(work / "retrieval_out"),
                "--data",
                f"movielens:{requests}",
                "--k",
                str(K),
                "-o",
                str(work / "retrieved.csv"),
            ]
        )
        == 0
    )
    retrieved: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for _, line, _, item, score in _csv(work / "retrieved.csv"):
        retrieved[ASKED[int(line) - 1]].append((int(item), float(score)))
    pairs = [(user, item) for user in ASKED for item, _ in retrieved[user]]
    (work / "pairs.dat").write_text("".join(f"{user}::{item}::5::0\n" for user, item in pairs))
    assert (
        main(
            [
                "predict",
                str(work / "ranking_out"),
                "--data",
                f"movielens:{work / 'pairs.dat'}",
                "-o",
                str(work / "ranked.csv"),
            ]
        )
        == 0
    )
    scores = [float(row[2]) for row in _csv(work / "ranked.csv")]
    ranked = {}
    scored = list(enumerate(zip(pairs, scores, strict=True)))
    for user in ASKED:
        mine = [(score, rank, item) for rank, ((u, item), score) in scored if u == user]
        best = sorted(mine, key=lambda t: (-t[0], t[1]))[:N]
        ranked[user] = ([item for _, _, item in best], [score for score, _, _ in best])
    return {"retrieved": retrieved, "ranked": ranked}


@pytest.fixture(scope="module")
def server(work: Path) -> Any:
    args = [
        work / "retrieval_out",
        "--pipeline",
        work / "retrieval_out",
        work / "ranking_out",
        "--k",
        str(K),
        "--n",
        str(N),
    ]
    with started_server(args) as running:
        yield running


def _users(users: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "userId", "datatype": "INT64", "shape": [len(users)], "data": users}]}


def test_the_pipeline_answers_the_offline_retrieve_then_predict_top_n(server: Server, offline) -> None:
    status, _, body = server.call("GET", "/v2/models/tiny_retrieval_then_tiny_ranking")
    assert status == 200 and body["inputs"] == [{"name": "userId", "datatype": "INT64", "shape": [-1]}]
    assert body["outputs"] == [
        {"name": "items", "datatype": "INT64", "shape": [-1, N]},
        {"name": "scores", "datatype": "FP32", "shape": [-1, N]},
    ]
    status, _, body = server.call("POST", "/v2/models/tiny_retrieval_then_tiny_ranking/infer", _users(ASKED))
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["items"]["shape"] == outputs["scores"]["shape"] == [len(ASKED), N]
    items = np.array(outputs["items"]["data"]).reshape(len(ASKED), N)
    scores = np.array(outputs["scores"]["data"]).reshape(len(ASKED), N)
    for row, user in enumerate(ASKED):
        expected_items, expected_scores = offline["ranked"][user]
        assert items[row].tolist() == expected_items
        assert np.allclose(scores[row], expected_scores, rtol=1e-6, atol=1e-6)
    assert set(body["parameters"]) == {"retrieval_ms", "ranking_ms"}
    assert all(value >= 0 for value in body["parameters"].values())


def test_the_retrieval_export_served_alone_answers_retrieves_top_k(server: Server, offline) -> None:
    status, _, body = server.call("POST", "/v2/models/tiny_retrieval/infer", _users(ASKED))
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    items = np.array(outputs["items"]["data"]).reshape(len(ASKED), K)
    scores = np.array(outputs["scores"]["data"]).reshape(len(ASKED), K)
    for row, user in enumerate(ASKED):
        assert items[row].tolist() == [item for item, _ in offline["retrieved"][user]]
        assert np.allclose(scores[row], [score for _, score in offline["retrieved"][user]], rtol=1e-6, atol=1e-6)


def test_an_unknown_user_is_scored_with_row_zero_as_predict_does_and_a_bad_one_is_a_400(server: Server) -> None:
    status, _, _ = server.call("POST", "/v2/models/tiny_retrieval_then_tiny_ranking/infer", _users([999]))
    assert status == 200
    status, _, body = server.call("POST", "/v2/models/tiny_retrieval_then_tiny_ranking/infer", _users([-4]))
    assert (status, body) == (400, {"error": "input 'userId', row 0: not a non-negative integer (got '-4')"})
