"""A timestamps feature of a `history` sequence: each position's time is its training row's `time`, the
same rows as the history's ids (strictly earlier, ties excluded), checked against a hand-built expectation,
and the same on the raw, prepared and predict paths."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compiler.lowering.instantiate import model_inputs
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.loader import epoch_batches
from runtime.data.prepared.batches import prepared_epoch_batches
from runtime.data.prepared.prepare import PrepareSettings, prepare
from runtime.data.prepared.reading import open_prepared
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.learn import learn_features

SPEC = """\
version: 1
name: history_times
features:
  sparse:
    - {name: movie, table: movie, vocabulary: {}}
    - {name: seen, table: movie, pooling: none, max_length: 3, history: {of: movie, by: user, time: ts}}
  timestamps:
    - {name: seen_time, sequence: seen}
tables:
  - {name: movie, num_embeddings: 20, dim: 4}
model:
  encoder: {type: hstu, input: sparse.seen, timestamps: timestamps.seen_time, num_layers: 1, num_heads: 1,
            attention_dim: 4, linear_dim: 4, num_buckets: 8}
heads:
  - {name: next_item, loss: sampled_softmax, input: encoder, item: sparse.seen, negatives: {uniform: 4}}
training: {batch_size: 4}
data:
  reader: csv
  path: train.csv
  columns: {movie: movie}
"""
TRAIN = [  # user, movie, ts (file order is not time order)
    ("a", "m1", 100),
    ("a", "m3", 300),
    ("a", "m2", 200),
    ("a", "m4", 300),
    ("a", "m5", 400),
    ("a", "m6", 500),
    ("b", "m2", 50),
    ("b", "m9", 60),
]
TEST = [("a", "m7", 300), ("a", "m8", 600), ("b", "m1", 50), ("c", "m1", 10), ("a", "m2", "")]
SHAPE = {"global_batch": len(TEST), "rank": 0, "world_size": 1}


def _write(path: Path, rows: list[tuple]) -> Path:
    path.write_text("user,movie,ts\n" + "".join(f"{u},{m},{t}\n" for u, m, t in rows))
    return path


def _expected(user: str, time: float) -> list[tuple[str, int]]:
    """Hand-built: the user's training rows strictly before `time`, oldest first, the last 3."""
    earlier = sorted((t, m) for u, m, t in TRAIN if u == user and t < time)
    return [(m, t) for t, m in earlier][-3:]


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("history_times")
    (root / "spec.yaml").write_text(SPEC)
    inputs = model_inputs(validate(load(str(root / "spec.yaml"))))
    train, test = _write(root / "train.csv", TRAIN), _write(root / "test.csv", TEST)
    state = learn_features(open_reader(inputs, DataChoice("csv", str(train))), progress=False)
    return root, dataclasses.replace(inputs, learned=state), test


def _batch(reader):
    (local,) = epoch_batches(reader, **SHAPE, bad_rows=BadRowLog("fail"), num_workers=0)
    return local.batch


def test_history_times_are_the_times_of_the_historys_own_rows(learned) -> None:
    _, inputs, test = learned
    batch = _batch(open_reader(inputs, DataChoice("csv", str(test))))
    movies = inputs.learned.get("movie").state.rows
    seen, times = batch.sparse["seen"], batch.sparse["seen_time"]
    assert times.lengths().tolist() == seen.lengths().tolist()
    at = 0
    for (user, _, time), length in zip(TEST, seen.lengths().tolist(), strict=True):
        expected = _expected(user, float("inf") if time == "" else time)
        assert seen.values()[at : at + length].tolist() == [movies[m] for m, _ in expected]
        assert times.values()[at : at + length].tolist() == [t for _, t in expected]
        at += length
    # a: m3 and m4 at 300 are not the history of a row at 300 (a tie), m2 at 200 is; an empty time is "now"
    assert [t for _, t in _expected("a", 300)] == [100, 200]
    assert times.values().tolist()[:2] == [100, 200]
    assert seen.lengths().tolist() == [2, 3, 0, 0, 3]


def test_prepared_history_times_are_the_raw_ones(learned) -> None:
    root, inputs, test = learned
    prepare(inputs, DataChoice("csv", str(test)), root / "prepared", PrepareSettings(training=str(root / "train.csv")))
    direct = _batch(open_reader(inputs, DataChoice("csv", str(test))))
    (prepared,) = prepared_epoch_batches(open_prepared(inputs, root / "prepared"), **SHAPE, num_workers=0)
    for key in ("seen", "seen_time"):
        assert prepared.batch.sparse[key].values().tolist() == direct.sparse[key].values().tolist()
        assert prepared.batch.sparse[key].lengths().tolist() == direct.sparse[key].lengths().tolist()
