"""runtime/data/tables/learn_columns.py and the vectorised vocabulary: the same state, ids and collision
counts as the row-by-row path, on random data with bad rows, quotes, empty fields, OOV values and ties."""

from __future__ import annotations

import random

import pytest

from compiler.lowering.instantiate import model_inputs
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.config.transforms import Vocabulary
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables import learn
from runtime.data.tables.collisions import CollisionCounter
from runtime.features.hashing import hash_text
from runtime.features.registry import transform

SPEC = """\
version: 1
name: columns
features:
  dense:
    - {name: age, size: 1, transform: {fill: mean, scale: standardize}}
    - {name: pair, size: 2, transform: {clip: [-5, 50], log: true, scale: min_max}}
  sparse:
    - {name: user, num_embeddings: 40, dim: 4, vocabulary: {min_count: 2, max_size: 30, oov_buckets: 3}}
    - {name: item, table: items, vocabulary: {max_size: 25}}
    - {name: tags, num_embeddings: auto, dim: 4, max_ids_per_sample: 4, pooling: mean, vocabulary: {max_size: 6}}
    - {name: seen, table: items, pooling: none, max_length: 5, history: {of: item, by: user, time: ts}}
    - {name: liked, table: items, pooling: none, max_length: 5,
       history: {of: item, by: user, time: ts, where: {column: label, equals: 1}}}
    - {name: age_bucket, column: age, quantiles: 4, dim: 4}
    - {name: city, num_embeddings: 16, dim: 4}
    - {name: user_city, cross: [user, city], num_embeddings: 64, dim: 4}
tables:
  - {name: items, num_embeddings: 30, dim: 4}
model:
  top: {type: mlp, input: [sparse.user, sparse.item, sparse.tags, sparse.age_bucket, sparse.city,
                           sparse.user_city, dense.age, dense.pair], layers: [1]}
heads:
  - {name: click, input: top, loss: bce}
training: {batch_size: 8}
data:
  reader: csv
  path: rows.csv
  columns: {user: user, item: item, tags: tags, age: age, p0: pair, p1: pair, city: city, label: click}
"""
HEADER = "user,item,tags,age,p0,p1,city,ts,label"


BAD = [  # what only the row path reads, or refuses, and two lines both read alike (last); {u} is a user
    '"{u}",i1,a,30,1,2,c1,880000001,1',
    "{u},i1,a|b|c|d|e,30,1,2,c1,1,0",
    "{u},i1,a,thirty,1,2,c1,1,0",
    "{u},i1,a,30,nan,2,c1,1,0",
    "{u},i1,a,30",
    "{u}|x,i1,a,30,1,2,c1,1,0",
    "{u},i1,a, 30,1,2,c1,1,0",
    "{u},i1,a,30,1_0,2,c1,1,0",
    "{u},i1,a,30,1,2,c1,soon,0",
    "{u},i1,a,30,1,inf,c1,1,0",
    "",
    "{u},i1,a,30,+1,2,c1,1,0",  # an empty line is no row on either path; float and Arrow both read +1
]
BY_COLUMN = 2  # the last BAD lines, which the columnar path takes


def _rows(rng: random.Random, n: int, bad: str | None = None) -> list[str]:
    """`n` random rows; with `bad`, a few of them replaced by that bad line."""
    lines = []
    for _ in range(n):
        user = f"u{int(rng.paretovariate(1.0)) % 50}"  # skewed: many ties in count, a long tail of rare users
        item = f"i{rng.randrange(40)}"
        tags = "|".join(rng.sample("abcdefgh", rng.randint(0, 3)))
        age = "" if rng.random() < 0.1 else str(rng.randint(10, 70))
        p0, p1 = f"{rng.uniform(-10, 80):.3f}", rng.choice(["", "1e1", "3", "-2.5", ".5"])
        ts = rng.choice(["", str(880000000 + rng.randrange(40))])  # ties in time, and empty times
        lines.append(",".join([user, item, tags, age, p0, p1, f"c{rng.randrange(9)}", ts, str(rng.randint(0, 1))]))
        if bad is not None and rng.random() < 0.01:
            lines[-1] = bad.format(u=user)
    return lines


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("learn_columns")
    (root / "spec.yaml").write_text(SPEC)
    rng = random.Random(7)
    rows = _rows(rng, 3000) + [row for bad in BAD for row in _rows(rng, 500, bad)]  # one kind of bad per chunk
    (root / "rows.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    inputs = model_inputs(validate(load(str(root / "spec.yaml"))))
    return open_reader(inputs, DataChoice("csv", str(root / "rows.csv")))


def _learned(reader, columnar: bool, monkeypatch: pytest.MonkeyPatch):
    calls = []
    original = learn.chunk_raws

    def spy(*args, **kwargs):
        found = original(*args, **kwargs) if columnar else None
        calls.append(found is not None)
        return found

    monkeypatch.setattr(learn, "chunk_raws", spy)
    counter = CollisionCounter(reader.layout, 4000)
    state = learn.learn_features(reader, progress=False, collisions=counter)
    return state, counter.result(), calls


def test_columnar_learning_gives_the_row_paths_state_and_collisions(reader, monkeypatch) -> None:
    learn.CHUNK_ROWS, chunk = 500, learn.CHUNK_ROWS
    try:
        by_column, collisions, calls = _learned(reader, True, monkeypatch)
        by_row, row_collisions, _ = _learned(reader, False, monkeypatch)
    finally:
        learn.CHUNK_ROWS = chunk
    assert calls[:6] == [True] * 6  # the clean chunks went by column
    rows_chunks = len(BAD) - BY_COLUMN
    assert calls[6:] == [False] * rows_chunks + [True] * BY_COLUMN  # each chunk with a bad row went row by row
    assert by_column.to_bytes() == by_row.to_bytes()
    assert collisions == row_collisions
    assert collisions[0].rows_read == 4000
    user = by_column.get("user").state
    assert 0 < len(user.values) < user.seen  # min_count left some out


def test_vectorised_vocabulary_apply_is_the_dict_lookup() -> None:
    rng = random.Random(3)
    vocabulary = transform("vocabulary")
    for config in (Vocabulary(), Vocabulary(min_count=2, max_size=50, oov_buckets=7)):
        counts = vocabulary.fit(config, [f"v{int(rng.paretovariate(0.8)) % 500}" for _ in range(5000)])
        state = vocabulary.finish(config, counts, 200)
        raw = [f"v{rng.randrange(700)}" for _ in range(3000)] + ["", "v1"]
        expected = [state.rows[v] if v in state.rows else hash_text(v) % config.oov_buckets for v in raw]
        assert vocabulary.apply(config, state, raw).tolist() == expected
        # the per-value ordering: count down, then text; exactly max_size kept
        ranked = sorted((v for v, c in counts.items() if c >= config.min_count), key=lambda v: (-counts[v], v))
        assert state.values == ranked[: min(len(ranked), config.max_size or 10**9, 200 - config.oov_buckets)]
    assert vocabulary.apply(Vocabulary(), state, []).tolist() == []


def test_arrow_counts_are_the_counters() -> None:
    import pyarrow as pa

    values = [random.Random(5).choice(["a", "b", "", "é", "a|b"]) for _ in range(1000)]
    vocabulary = transform("vocabulary")
    assert vocabulary.fit(Vocabulary(), pa.array(values)) == vocabulary.fit(Vocabulary(), values)


def test_a_column_with_no_value_in_any_training_row_is_warned_of(tmp_path) -> None:
    """age (numeric, and the quantiles of age_bucket), pair's second column and tags: empty in every row;
    training would go on with a constant input, so learning says so, per feature, to its `warn`."""
    (tmp_path / "spec.yaml").write_text(SPEC)
    rng = random.Random(3)
    rows = [
        f"u{rng.randrange(9)},i{rng.randrange(9)},,,{rng.uniform(0, 9):.2f},,c1,1,{rng.randint(0, 1)}"
        for _ in range(50)
    ]
    (tmp_path / "rows.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    inputs = model_inputs(validate(load(str(tmp_path / "spec.yaml"))))
    warnings: list[str] = []
    reader = open_reader(inputs, DataChoice("csv", str(tmp_path / "rows.csv")))
    learned = learn.learn_features(reader, progress=False, warn=warnings.append)
    assert warnings == [
        "warning: feature age (numeric): its column has no value in any training row: "
        "it is the same constant in every row",
        "warning: feature pair (numeric): column 1 of it has no value in any training row: "
        "it is the same constant in every row",
        "warning: feature tags (vocabulary): no training row has a value: "
        "the vocabulary is empty, every value is out of it",
        "warning: feature age_bucket (quantiles): no training row has a value: every row falls in one bucket",
    ]
    assert learned.get("age").state["mean"] == [0.0] and learned.get("tags").state.values == []
