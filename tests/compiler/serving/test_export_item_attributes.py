"""An item tower reading three attributes, end to end: train on CSV -> export -> retrieve.

Items 0..29 each have a category, a brand and a price bucket (a fixed function
of the id, so `on_conflict: error` holds); users prefer the items of one
category. Training fills the item catalogue from the rows; items 30..39 never
appear, so they keep no attributes. The reference is the training module with
the checkpoint loaded: its `item_catalogue` is every item's vector computed
from the catalogue's attributes, and equals an item tower run on batches that
carry the attributes themselves; the export's item vectors are exactly it, and
`retrieve`'s top 5 per request is the brute-force top 5 of the trained model's
query vector against it. A training row that contradicts an earlier one under
`on_conflict: error` stops training with one line naming the item and both ids.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.data.checks.bad_rows import BadRowLog
from runtime.serving.export_dir import load
from runtime.serving.samples import file_samples, requests_reader
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

USERS, ITEMS, SEEN = 24, 40, 30
SPEC = """\
version: 1
name: attributed
features:
  sparse:
    - {name: user_id, num_embeddings: 24, dim: 8}
    - {name: item_id, num_embeddings: 40, dim: 8}
    - {name: category, num_embeddings: 4, dim: 4}
    - {name: brand, num_embeddings: 7, dim: 4}
    - {name: price_bucket, num_embeddings: 3, dim: 4}
model:
  user_tower: {type: mlp, input: sparse.user_id, layers: [16, 8]}
  item_tower: {type: mlp, input: [sparse.item_id, sparse.category, sparse.brand, sparse.price_bucket], layers: [16, 8]}
heads:
  - name: match
    loss: sampled_softmax
    input: user_tower
    item: item_tower
    item_attributes: {features: [category, brand, price_bucket], on_conflict: error}
    negatives: {in_batch: true, uniform: 8}
    temperature: 0.2
    normalize: true
training:
  batch_size: 32
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
data:
  reader: csv
  path: train.csv
  columns: {user_id: user_id, item_id: item_id, category: category, brand: brand, price_bucket: price_bucket}
"""


def attributes(item: int) -> tuple[int, int, int]:
    return item % 4, (item * 3) % 7, item % 3


def write_rows(path: Path, count: int, rng: random.Random) -> Path:
    lines = ["user_id,item_id,category,brand,price_bucket"]
    for _ in range(count):
        user = rng.randrange(USERS)
        item = rng.choice([i for i in range(SEEN) if i % 4 == user % 4]) if rng.random() < 0.8 else rng.randrange(SEEN)
        lines.append(",".join(str(v) for v in (user, item, *attributes(item))))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attributes")
    (root / "spec.yaml").write_text(SPEC)
    rng = random.Random(5)
    write_rows(root / "train.csv", 1500, rng)
    write_rows(root / "requests.csv", 20, rng)
    code = main(
        [
            "train",
            str(root / "spec.yaml"),
            "--data",
            f"csv:{root / 'train.csv'}",
            "--steps",
            "40",
            "--log-every",
            "40",
            "--data-workers",
            "0",
            "--checkpoint-dir",
            str(root / "ckpt"),
            "-o",
            str(root / "build"),
        ]
    )
    assert code == 0
    assert (
        main(
            [
                "export",
                str(root / "spec.yaml"),
                "--checkpoint",
                str(root / "ckpt"),
                "--index",
                "exact",
                "-o",
                str(root / "served"),
            ]
        )
        == 0
    )
    return root


def _trained(work: Path):
    module = load_module(str(work / "build" / "attributed.py"))
    model = module.build()
    load_checkpoint(
        work / "ckpt",
        model,
        make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters()),
        spec_sha256=module.SPEC_SHA256,
    )
    return module, model.eval()


def test_the_catalogue_holds_the_seen_items_attributes_and_gives_their_vectors(work: Path) -> None:
    module, model = _trained(work)
    table = model.item_attributes.table
    assert table[:SEEN].tolist() == [list(attributes(i)) for i in range(SEEN)]
    assert (table[SEEN:] == -1).all()
    # The item tower on batches carrying the attributes themselves, as the training rows do.
    keys = module.INPUTS.sparse
    names = [f.name for f in keys]
    ids = torch.arange(SEEN)
    columns = {
        "user_id": torch.zeros(SEEN, dtype=torch.long),
        "item_id": ids,
        **{
            name: torch.tensor([attributes(i)[k] for i in range(SEEN)])
            for k, name in enumerate(("category", "brand", "price_bucket"))
        },
    }
    batch = KeyedJaggedTensor.from_lengths_sync(
        keys=names,
        values=torch.cat([columns[n] for n in names]),
        lengths=torch.ones(len(names) * SEEN, dtype=torch.long),
    )
    with torch.no_grad():
        forward = torch.nn.functional.normalize(model({}, batch)["match"].positive, dim=-1)
        catalogue = model.item_catalogue()
    torch.testing.assert_close(catalogue[:SEEN], forward, rtol=0, atol=1e-6)
    with torch.no_grad():  # an unseen item: its attribute bags are empty, not row 0's
        without = model.item_vectors(torch.tensor([SEEN]))
    assert not torch.allclose(without, catalogue[0:1])


def test_the_export_serves_the_trained_item_vectors_and_retrieve_ranks_as_the_model(work: Path, capsys) -> None:
    module, model = _trained(work)
    with torch.no_grad():
        catalogue = model.item_catalogue()
    _, served = load(work / "served")
    stored = torch.load(work / "served" / "item_vectors.pt", weights_only=True)
    torch.testing.assert_close(stored, catalogue, rtol=0, atol=1e-6)
    torch.testing.assert_close(served.item_vectors(torch.arange(ITEMS)), catalogue, rtol=0, atol=1e-6)
    capsys.readouterr()
    output = work / "results.csv"
    requests = work / "requests.csv"
    assert main(["retrieve", str(work / "served"), "--data", f"csv:{requests}", "--k", "5", "-o", str(output)]) == 0
    with open(output, newline="") as stream:
        rows = list(csv.reader(stream))[1:]
    _, batch = next(file_samples(requests_reader(module.INPUTS, f"csv:{requests}", None), 100, BadRowLog()))
    with torch.no_grad():
        scores = model.query_vectors(batch.dense, batch.sparse) @ catalogue.T
    best = scores.topk(5, dim=1)
    assert len(rows) == 5 * scores.shape[0]
    for request in range(scores.shape[0]):
        mine = rows[5 * request : 5 * request + 5]
        assert [int(r[3]) for r in mine] == best.indices[request].tolist()
        assert [float(r[4]) for r in mine] == pytest.approx(best.values[request].tolist(), abs=1e-5)


def test_a_row_contradicting_an_earlier_one_stops_training_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    lines = ["user_id,item_id,category,brand,price_bucket"]
    lines += [",".join(str(v) for v in (i % USERS, i % SEEN, *attributes(i % SEEN))) for i in range(40)]
    lines.append("3,5,2,1,2")  # item 5's category is 1 in the rows above
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    code = main(
        [
            "train",
            str(tmp_path / "spec.yaml"),
            "--data",
            f"csv:{tmp_path / 'train.csv'}",
            "--steps",
            "3",
            "--data-workers",
            "0",
            "-o",
            str(tmp_path / "build"),
        ]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert (
        err[-1] == "error: rank 0: item 5: its 'category' is 2 in a training row but 1 in an earlier one "
        "(item_attributes on_conflict: error)"
    )
