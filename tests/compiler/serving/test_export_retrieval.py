"""Retrieval end to end on a small MovieLens-format file: split -> train -> export -> retrieve.

The generated ratings.dat plants a signal: user u rates 5 the movies of its
group (u mod 4) and 2 a few others (not positives). `reccompile data split`
holds each user's latest positives out; a two-tower spec trains on the rest
with in-batch negatives. The reference for the export is the training
module (its `query_vectors` and `item_vectors`) with the checkpoint loaded:
the fp32 export's towers give exactly its vectors. Movie ids are not table
rows (they are 1000 + 7k), so every id the index and the results show is
checked to be an original movie id of the training vocabulary.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from compiler.commands.export import items_warning
from runtime.checkpoint.store import load_checkpoint
from runtime.data.movielens.vocab import read_vocabulary
from runtime.retrieval.index_files import load_index
from runtime.retrieval.index_quality import IndexQuality
from runtime.serving.export_dir import load
from runtime.serving.item_index import ItemsReport
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

USERS, MOVIES, GROUPS = 48, 32, 4
SPEC = """\
version: 1
name: tiny_retrieval
features:
  sparse:
    - {{name: user_id, num_embeddings: {users}, dim: 16}}
    - {{name: movie_id, table: movie}}
tables:
  - {{name: movie, num_embeddings: {movies}, dim: 16}}
model:
  user_tower: {{type: mlp, input: sparse.user_id, layers: [32, 16], final_activation: none}}
  item_tower: {{type: mlp, input: sparse.movie_id, layers: [32, 16], final_activation: none}}
heads:
  - name: match
    loss: sampled_softmax
    input: user_tower
    item: item_tower
    negatives: {{in_batch: true}}
    temperature: 0.2
    normalize: true
training:
  batch_size: 64
  seed: 3
  dense_optimizer: {{type: adam, lr: 0.01}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
""".format(users=USERS + 1, movies=MOVIES + 1)


def movie_id(k: int) -> int:
    return 1000 + 7 * k


def write_ratings(path: Path) -> Path:
    rng = random.Random(0)
    lines = []
    for user in range(1, USERS + 1):
        liked = [k for k in range(MOVIES) if k % GROUPS == user % GROUPS]
        others = rng.sample([k for k in range(MOVIES) if k % GROUPS != user % GROUPS], 3)
        rated = [(k, 5) for k in liked] + [(k, 2) for k in others]
        rng.shuffle(rated)
        lines += [f"{user}::{movie_id(k)}::{stars}::{100 * user + t}" for t, (k, stars) in enumerate(rated)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("retrieval")
    (root / "tiny.yaml").write_text(SPEC)
    ratings = write_ratings(root / "ml" / "ratings.dat")
    assert (
        main(["data", "split", "--data", f"movielens:{ratings}", "--holdout", "0.25", "-o", str(root / "split")]) == 0
    )
    code = main(
        [
            "train",
            str(root / "tiny.yaml"),
            "--data",
            f"movielens:{root / 'split' / 'train' / 'ratings.dat'}",
            "--steps",
            "150",
            "--log-every",
            "50",
            "--checkpoint-dir",
            str(root / "ckpt"),
            "-o",
            str(root / "build"),
        ]
    )
    assert code == 0
    return root


def _export(work: Path, name: str, *options: str) -> int:
    return main(
        [
            "export",
            str(work / "tiny.yaml"),
            "--checkpoint",
            str(work / "ckpt"),
            *options,
            "-o",
            str(work / name),
        ]
    )


def test_export_writes_item_vectors_and_an_index_of_original_ids_and_reports_recall(work: Path, capsys) -> None:
    test = work / "split" / "test" / "ratings.dat"
    assert _export(work, "exact", "--index", "exact", "--eval-data", f"movielens:{test}") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3] == f"wrote {work / 'exact' / 'item_vectors.pt'} ({MOVIES} items x 16)"
    assert out[-2] == f"wrote {work / 'exact' / 'index'}/ (exact index)"
    held_out = len(test.read_text().splitlines())
    assert out[-1].startswith("index exact: recall@32 ") and out[-1].endswith(
        f"(ratio 1.0000), top-32 overlap 1.0000: ok (>= 0.95) ({held_out} queries: movielens:{test}, "
        "one held-out positive each)"
    )
    manifest = json.loads((work / "exact" / "manifest.json").read_text())
    section = manifest["retrieval"]
    assert (section["head"], section["item_feature"], section["items"], section["normalize"]) == (
        "match",
        "movie_id",
        MOVIES,
        True,
    )
    assert section["quality"]["ok"] and section["quality"]["ratio"] == 1.0
    index = load_index(work / "exact" / "index")
    vocabulary = read_vocabulary(work / "exact" / "vocab.json")
    assert index.ids.tolist() == sorted(vocabulary.movies) == [movie_id(k) for k in range(MOVIES)]


def test_the_exported_towers_give_exactly_the_trained_models_vectors(work: Path) -> None:
    assert _export(work, "towers", "--index", "exact") == 0
    module = load_module(str(work / "build" / "tiny_retrieval.py"))
    trained = module.build()
    load_checkpoint(
        work / "ckpt",
        trained,
        make_dense_optimizer(module.DENSE_OPTIMIZER, trained.dense_parameters()),
        spec_sha256=module.SPEC_SHA256,
    )
    trained.eval()
    served_module, served = load(work / "towers")
    rows = torch.arange(1, MOVIES + 1)
    batch = module.synthetic_batch(16, step=0, seed=1)
    with torch.no_grad():
        assert torch.equal(served.item_vectors(rows), trained.item_vectors(rows))
        assert torch.equal(
            served.query_vectors(batch.dense, batch.sparse), trained.query_vectors(batch.dense, batch.sparse)
        )
        stored = torch.load(work / "towers" / "item_vectors.pt", weights_only=True)
        assert torch.equal(stored, trained.item_vectors(rows))
        assert torch.allclose(stored.norm(dim=1), torch.ones(MOVIES), atol=1e-6)  # the head normalises
    assert served_module.RETRIEVAL["item_table"] == "movie"


def test_the_served_towers_build_no_autograd_graph_without_no_grad(work: Path) -> None:
    assert _export(work, "graphless", "--index", "exact") == 0
    _, served = load(work / "graphless")
    batch = load_module(str(work / "build" / "tiny_retrieval.py")).synthetic_batch(4, step=0, seed=1)
    vectors = [served.item_vectors(torch.arange(1, 5)), served.query_vectors(batch.dense, batch.sparse)]
    assert [(v.requires_grad, v.grad_fn) for v in vectors] == [(False, None)] * 2


def _results(path: Path) -> list[list[str]]:
    with open(path, newline="") as stream:
        return list(csv.reader(stream))


def test_retrieve_writes_the_top_k_original_ids_and_beats_popularity(work: Path, capsys) -> None:
    assert _export(work, "served", "--index", "flat" if _has_faiss() else "exact") == 0
    capsys.readouterr()
    test = work / "split" / "test" / "ratings.dat"
    output = work / "results.csv"
    assert main(["retrieve", str(work / "served"), "--data", f"movielens:{test}", "--k", "10", "-o", str(output)]) == 0
    requests = [line.split("::") for line in test.read_text().splitlines()]
    report = capsys.readouterr().out
    assert (
        report.startswith(f"wrote the top 10 of {MOVIES} items (")
        and f"for {len(requests)} requests to {output}" in report
    )
    rows = _results(output)
    assert rows[0] == ["file", "line", "rank", "item", "score"]
    assert len(rows) - 1 == 10 * len(requests)
    module, model = load(work / "served")
    items = torch.load(work / "served" / "item_vectors.pt", weights_only=True)
    position = {movie_id(k): k for k in range(MOVIES)}
    hits = 0
    for number, request in enumerate(requests, start=1):
        mine = rows[1 + 10 * (number - 1) : 1 + 10 * number]
        assert [r[:3] for r in mine] == [[str(test), str(number), str(rank)] for rank in range(1, 11)]
        found, scores = [int(r[3]) for r in mine], [float(r[4]) for r in mine]
        assert set(found) <= set(position) and scores == sorted(scores, reverse=True)
        hits += int(request[1]) in found
    # the scores are the query tower's vector against the stored item vectors, best first
    first = _request_batch(module, test, work / "served" / "vocab.json")
    with torch.no_grad():
        exact = items @ model.query_vectors(first.dense, first.sparse)[0]
    best = exact.topk(10)
    assert [int(r[3]) for r in rows[1:11]] == [movie_id(int(i)) for i in best.indices]
    assert [float(r[4]) for r in rows[1:11]] == pytest.approx(best.values.tolist(), abs=1e-6)
    # the planted signal: a held-out positive is one of the user's 8 group movies; popularity
    # (the 10 most-liked training movies for everyone) finds about 10/32 of them
    popularity = _popularity_recall(work, requests)
    assert hits / len(requests) > max(0.6, popularity + 0.2)


def _has_faiss() -> bool:
    from runtime.retrieval.index import faiss_available

    return faiss_available()


def _request_batch(module, ratings: Path, vocabulary: Path):
    """The first request of `ratings` as retrieve reads it; its user's row checked against the vocabulary."""
    from runtime.data.checks.bad_rows import BadRowLog
    from runtime.serving.samples import file_samples, requests_reader

    known = read_vocabulary(vocabulary)
    _, batch = next(file_samples(requests_reader(module.INPUTS, f"movielens:{ratings}", known), 1, BadRowLog()))
    user = int(ratings.read_text().split("::", 1)[0])
    assert batch.sparse["user_id"].values().tolist() == [known.users[user]]
    return batch


def _popularity_recall(work: Path, requests: list[list[str]]) -> float:
    counts: dict[int, int] = {}
    for line in (work / "split" / "train" / "ratings.dat").read_text().splitlines():
        movie = int(line.split("::")[1])
        counts[movie] = counts.get(movie, 0) + 1
    top = set(sorted(counts, key=lambda m: (-counts[m], m))[:10])
    return sum(int(r[1]) in top for r in requests) / len(requests)


@pytest.mark.parametrize(
    ("idle", "options", "used", "said"),
    [
        (1.1, [], 1, "1 thread (1 of 2 cores free)"),  # a busy neighbour: one thread, not torch's two
        (2.0, [], 2, "2 threads (2 of 2 cores free)"),
        (0.3, ["--threads", "3"], 3, "3 threads (--threads; 2 cores usable)"),  # the user's number stands
    ],
)
def test_retrieve_takes_the_free_cores_unless_told_and_says_so(
    work: Path, capsys, two_cores, tmp_path: Path, idle: float, options: list[str], used: int, said: str
) -> None:
    if not (work / "exact").exists():
        assert _export(work, "exact", "--index", "exact") == 0
    two_cores(idle)
    capsys.readouterr()
    test = work / "split" / "test" / "ratings.dat"
    assert (
        main(["retrieve", str(work / "exact"), "--data", f"movielens:{test}", *options, "-o", str(tmp_path / "r.csv")])
        == 0
    )
    assert torch.get_num_threads() == used
    assert capsys.readouterr().out.split(" s) ", 1)[1] == (
        f"on {said}; 0 bad rows skipped; ids not in the training vocabulary (row 0): user_id 0, movie_id 0 of 96 rows\n"
    )


def test_bad_requests_name_file_and_line_and_a_model_without_retrieval_is_refused(
    work: Path, capsys, tmp_path: Path
) -> None:
    assert _export(work, "bad", "--index", "exact") == 0
    capsys.readouterr()
    requests = tmp_path / "ratings.dat"
    requests.write_text("1::1000::5::10\n2::x::5::11\n")
    code = main(["retrieve", str(work / "bad"), "--data", f"movielens:{requests}", "-o", str(tmp_path / "r.csv")])
    assert code == 1
    assert f"{requests}:2" in capsys.readouterr().err and not (tmp_path / "r.csv").exists()
    assert main(["predict", str(work / "bad"), "-o", str(tmp_path / "p.csv")]) == 1
    assert (
        capsys.readouterr().err
        == f"error: {work / 'bad'}: a retrieval model scores no samples; use reccompile retrieve\n"
    )


def test_an_index_below_the_recall_threshold_is_said_so() -> None:
    quality = IndexQuality("ivf", 100, overlap=0.9, recall=0.3, exact_recall=0.4, threshold=0.95)
    report = ItemsReport(1000, quality, 50, "movielens:test.dat, one held-out positive each")
    assert report.describe() == (
        "index ivf: recall@100 0.3000 vs exact 0.4000 (ratio 0.7500), top-100 overlap 0.9000: BELOW 0.95 of exact "
        "search (50 queries: movielens:test.dat, one held-out positive each)"
    )
    assert items_warning({"index": {"kind": "ivf"}}, report) == (
        "warning: the ivf index keeps less than 0.95 of exact search's recall@100: export with --index flat "
        "(or exact) to serve exact results"
    )
