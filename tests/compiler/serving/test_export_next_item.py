"""A next-item model end to end on a small MovieLens-format file: train -> export -> retrieve.

The generated ratings.dat plants a signal: every user rates 5, one after the
other, the movies of its group (u mod 4) in the group's fixed order, so a
history's next movie follows from its last one. The reference for the
export is the training module (its `query_vectors`, the last real position
of the encoder's output, and its item table rows) with the checkpoint
loaded: the fp32 export gives exactly its vectors. Movie ids are 1000 + 7k,
not table rows.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.retrieval.index_files import load_index
from runtime.serving.export_dir import load
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

USERS, MOVIES, GROUPS = 40, 32, 4
SPEC = """\
version: 1
name: tiny_next_item
features:
  sparse:
    - {{name: history, table: item, pooling: none, max_length: 8}}
tables:
  - {{name: item, num_embeddings: {rows}, dim: 16, init: {{min: -0.5, max: 0.5}}}}
model:
  encoder: {{type: transformer, input: sparse.history, num_layers: 1, num_heads: 1, ffn_dim: 16, norm: pre,
            causal: true, positions: learned}}
heads:
  - name: next_item
    loss: sampled_softmax
    input: encoder
    item: sparse.history
    negatives: {{uniform: 16}}
    temperature: 0.1
    normalize: true
training:
  batch_size: 32
  seed: 3
  dense_optimizer: {{type: adam, lr: 0.01}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
""".format(rows=MOVIES + 1)


def movie_id(k: int) -> int:
    return 1000 + 7 * k


def write_ratings(path: Path) -> Path:
    lines = []
    for user in range(1, USERS + 1):
        liked = [k for k in range(MOVIES) if k % GROUPS == user % GROUPS]
        start = user % len(liked)
        ordered = liked[start:] + liked[:start]
        lines += [f"{user}::{movie_id(k)}::5::{100 * user + t}" for t, k in enumerate(ordered)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("next_item")
    (root / "tiny.yaml").write_text(SPEC)
    ratings = write_ratings(root / "ml" / "ratings.dat")
    code = main(
        [
            "train",
            str(root / "tiny.yaml"),
            "--data",
            f"movielens:{ratings}",
            "--steps",
            "60",
            "--log-every",
            "30",
            "--checkpoint-dir",
            str(root / "ckpt"),
            "-o",
            str(root / "build"),
        ]
    )
    assert code == 0
    code = main(
        [
            "export",
            str(root / "tiny.yaml"),
            "--checkpoint",
            str(root / "ckpt"),
            "--index",
            "exact",
            "--eval-data",
            f"movielens:{ratings}",
            "-o",
            str(root / "out"),
        ]
    )
    assert code == 0
    return root


def _trained(work: Path):
    module = load_module(str(work / "build" / "tiny_next_item.py"))
    trained = module.build()
    load_checkpoint(
        work / "ckpt",
        trained,
        make_dense_optimizer(module.DENSE_OPTIMIZER, trained.dense_parameters()),
        spec_sha256=module.SPEC_SHA256,
    )
    return module, trained.eval()


def test_the_export_of_a_next_item_model_gives_exactly_the_trained_models_vectors(work: Path) -> None:
    module, trained = _trained(work)
    served_module, served = load(work / "out")
    assert served_module.RETRIEVAL["next_item"] is True and served_module.RETRIEVAL["item_table"] == "item"
    rows = torch.arange(1, MOVIES + 1)
    batch = module.synthetic_batch(16, step=0, seed=1)
    assert int(batch.sparse["history"].lengths().max()) > 1  # histories of several items
    with torch.no_grad():
        assert torch.equal(
            served.query_vectors(batch.dense, batch.sparse), trained.query_vectors(batch.dense, batch.sparse)
        )
        assert torch.equal(served.item_vectors(rows), trained.item_vectors(rows))
        stored = torch.load(work / "out" / "item_vectors.pt", weights_only=True)
        assert torch.equal(stored, trained.item_vectors(rows))
    index = load_index(work / "out" / "index")
    assert index.ids.tolist() == [movie_id(k) for k in range(MOVIES)]
    section = json.loads((work / "out" / "manifest.json").read_text())["retrieval"]
    # the recall check's queries: every rating line with a history (all but each user's first)
    assert (section["items"], section["quality"]["queries"], section["quality"]["ratio"]) == (MOVIES, USERS * 7, 1.0)


def test_retrieve_on_histories_ranks_each_lines_next_movie(work: Path, tmp_path: Path, capsys) -> None:
    requests = tmp_path / "ratings.dat"
    # user 5's first three movies (group 1, starting at its 6th): the next one is the group's 4th after
    liked = [k for k in range(MOVIES) if k % GROUPS == 1]
    ordered = liked[5 % 8 :] + liked[: 5 % 8]
    requests.write_text("".join(f"5::{movie_id(k)}::5::{10 + t}\n" for t, k in enumerate(ordered[:4])))
    output = tmp_path / "results.csv"
    capsys.readouterr()
    assert main(["retrieve", str(work / "out"), "--data", f"movielens:{requests}", "--k", "5", "-o", str(output)]) == 0
    printed = capsys.readouterr()
    assert f"for 4 requests to {output}" in printed.out and "; 1 requests without a history" in printed.out
    assert printed.err == (
        "warning: 1 of 4 requests have no history in the requests file (no --history): no items written for them\n"
    )
    with open(output, newline="") as stream:
        rows = list(csv.reader(stream))
    # line 1 has no earlier movie: no rows, rather than the empty sequence's guesses
    assert rows[0] == ["file", "line", "rank", "item", "score"] and len(rows) == 1 + 3 * 5
    assert [r[1] for r in rows[1:]] == ["2"] * 5 + ["3"] * 5 + ["4"] * 5
    _, served = load(work / "out")
    items = torch.load(work / "out" / "item_vectors.pt", weights_only=True)
    # line 4's query is the history of lines 1-3: the exported query tower on that sequence
    history = torch.tensor([1 + k for k in ordered[:3]])
    from runtime.sparse.jagged import KeyedJaggedTensor

    sparse = KeyedJaggedTensor(["history"], history, None, lengths=torch.tensor([3]))
    with torch.no_grad():
        best = (items @ served.query_vectors({}, sparse)[0]).topk(5)
    last = rows[1 + 10 : 1 + 15]
    assert [r[:3] for r in last] == [[str(requests), "4", str(rank)] for rank in range(1, 6)]
    assert [int(r[3]) for r in last] == [movie_id(int(i)) for i in best.indices]
    assert [float(r[4]) for r in last] == pytest.approx(best.values.tolist(), abs=1e-6)
    assert movie_id(ordered[3]) in [int(r[3]) for r in last]  # the planted next movie


def test_held_out_requests_take_their_history_from_the_training_part_of_the_split(
    work: Path, tmp_path: Path, capsys
) -> None:
    assert (
        main(
            [
                "data",
                "split",
                "--data",
                f"movielens:{work / 'ml' / 'ratings.dat'}",
                "--holdout",
                "0.1",
                "-o",
                str(tmp_path / "split"),
            ]
        )
        == 0
    )
    train, test = tmp_path / "split" / "train" / "ratings.dat", tmp_path / "split" / "test" / "ratings.dat"
    export = [
        "export",
        str(work / "tiny.yaml"),
        "--checkpoint",
        str(work / "ckpt"),
        "--index",
        "exact",
        "--eval-data",
        f"movielens:{test}",
    ]
    capsys.readouterr()
    assert main([*export, "-o", str(tmp_path / "alone")]) == 1  # one line per user: no history in the file
    assert capsys.readouterr().err == (
        f"error: movielens:{test}: no held-out requests with a history to measure the index with: pass --history "
        "movielens:TRAIN, the training ratings they were split from, where their histories are\n"
    )
    assert main([*export, "--history", f"movielens:{train}", "-o", str(tmp_path / "out")]) == 0
    quality = json.loads((tmp_path / "out" / "manifest.json").read_text())["retrieval"]["quality"]
    assert quality["queries"] == USERS  # the last of each user's 8 positives held out, every one with a history
    assert quality["source"].endswith(
        f"histories from movielens:{train} and the file; 0 requests without a history skipped"
    )
    output = tmp_path / "results.csv"
    assert (
        main(
            [
                "retrieve",
                str(tmp_path / "out"),
                "--data",
                f"movielens:{test}",
                "--history",
                f"movielens:{train}",
                "--k",
                "3",
                "-o",
                str(output),
            ]
        )
        == 0
    )
    with open(output, newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == USERS * 3
    # user 1's held-out line: its query is user 1's 7 training movies, oldest first
    _, served = load(tmp_path / "out")
    from runtime.sparse.jagged import KeyedJaggedTensor

    liked = [k for k in range(MOVIES) if k % GROUPS == 1]
    ordered = liked[1:] + liked[:1]
    sparse = KeyedJaggedTensor(["history"], torch.tensor([1 + k for k in ordered[:7]]), None, lengths=torch.tensor([7]))
    items = torch.load(tmp_path / "out" / "item_vectors.pt", weights_only=True)
    with torch.no_grad():
        best = (items @ served.query_vectors({}, sparse)[0]).topk(3)
    first = [r for r in rows if r["line"] == "1"]
    assert [int(r["item"]) for r in first] == [movie_id(int(i)) for i in best.indices]
