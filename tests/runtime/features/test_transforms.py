"""runtime/features: each transform's fit / merge / finish / apply against plain formulas."""

from __future__ import annotations

import json
import math
import pickle
import re
from collections import Counter

import pytest
import torch

from runtime.config.transforms import Aggregate, Cross, History, Numeric, Quantiles, Vocabulary
from runtime.features.hashing import hash_id, hash_text
from runtime.features.registry import transform
from runtime.features.state import Learned, LearnedFeatures, read_features

VOCAB, NUMERIC, QUANT, HIST, AGG = (
    transform(k) for k in ("vocabulary", "numeric", "quantiles", "history", "aggregate")
)


def _learn(kind, config, chunks, rows=None):
    t = transform(kind)
    return t.finish(config, t.merge(config, [t.fit(config, chunk) for chunk in chunks]), rows)


def test_vocabulary_keeps_frequent_values_first_ties_by_text_and_maps_the_rest_to_oov() -> None:
    config = Vocabulary(min_count=2, max_size=3)
    state = _learn("vocabulary", config, [["b", "a", "c", "b"], ["a", "d", "c", "b", "e", "e"]])
    assert state.values == ["b", "a", "c"]  # b 3; a, c, e 2 (e cut by max_size); d 1 (below min_count)
    assert state.seen == 5
    assert VOCAB.apply(config, state, ["a", "b", "c", "e", "zzz"]).tolist() == [2, 1, 3, 0, 0]


def test_vocabulary_is_the_same_whatever_the_order_of_the_chunks() -> None:
    config = Vocabulary()
    chunks = [["x", "y", "y"], ["z", "x"], ["w"]]
    one = _learn("vocabulary", config, chunks)
    other = _learn("vocabulary", config, chunks[::-1])
    assert one.values == other.values == ["x", "y", "w", "z"]


def test_vocabulary_fits_in_the_table_and_hashes_oov_values_into_its_buckets() -> None:
    config = Vocabulary(oov_buckets=3)
    state = _learn("vocabulary", config, [[f"v{i}" for i in range(10)]], rows=7)
    assert len(state.values) == 4  # 7 rows - 3 OOV rows
    assert VOCAB.apply(config, state, ["v0", "v9", "new"]).tolist() == [3, hash_text("v9") % 3, hash_text("new") % 3]


def test_a_vocabulary_pickled_for_a_data_worker_maps_values_as_the_original() -> None:
    config = Vocabulary(oov_buckets=2)
    state = _learn("vocabulary", config, [["a", "b", "b", "c"]])
    copy = pickle.loads(pickle.dumps(state))  # a worker started by the fork server gets its reader so
    assert (copy.values, copy.seen, copy.oov_buckets) == (state.values, state.seen, state.oov_buckets)
    values = ["a", "b", "c", "zzz"]
    assert VOCAB.apply(config, copy, values).tolist() == VOCAB.apply(config, state, values).tolist()


def test_hash_takes_integers_mod_rows_and_hashes_text() -> None:
    assert [hash_id("17", 10), hash_id(-3, 10), hash_id("x", 10)] == [7, 7, hash_text("x") % 10]
    assert transform("cross").apply(Cross(("a", "b")), {}, ["1\x1fm"], 50) == [hash_text("1\x1fm") % 50]


def test_numeric_fill_mean_clip_log_standardize_against_the_formula() -> None:
    config = Numeric(fill="mean", clip=(0.0, 100.0), log=True, scale="standardize")
    raw = torch.tensor([[1.0], [math.nan], [3.0], [500.0]], dtype=torch.float64)
    state = _learn("numeric", config, [raw[:2], raw[2:]])
    fill = (1.0 + 3.0 + 500.0) / 3
    shaped = [math.log1p(min(max(v, 0.0), 100.0)) for v in (1.0, fill, 3.0, 500.0)]
    mean = sum(shaped) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in shaped) / 4)
    assert state["fill"] == [pytest.approx(fill)]
    got = NUMERIC.apply(config, state, raw)
    assert got.dtype == torch.float32
    assert got[:, 0].tolist() == pytest.approx([(v - mean) / std for v in shaped], rel=1e-6)


def test_numeric_min_max_and_a_fixed_fill() -> None:
    config = Numeric(fill=-1.0, scale="min_max")
    raw = torch.tensor([[2.0, 5.0], [math.nan, 5.0], [6.0, 5.0]], dtype=torch.float64)
    state = _learn("numeric", config, [raw])
    got = NUMERIC.apply(config, state, raw)
    assert got[:, 0].tolist() == pytest.approx([3 / 7, 0.0, 1.0])
    assert got[:, 1].tolist() == [0.0, 0.0, 0.0]  # a constant column: range 1


def test_quantiles_cut_equal_frequency_buckets() -> None:
    config = Quantiles(buckets=4)
    values = torch.arange(100, dtype=torch.float64)
    state = _learn("quantiles", config, [values[:30], values[30:]])
    assert state["boundaries"] == [25.0, 50.0, 75.0]
    ids = QUANT.apply(config, state, torch.tensor([0.0, 25.0, 74.9, 99.0, math.nan], dtype=torch.float64), 60.0)
    assert ids.tolist() == [0, 1, 2, 3, 2]
    assert torch.bincount(QUANT.apply(config, state, values, 0.0)).tolist() == [25, 25, 25, 25]


def test_history_is_the_strictly_earlier_rows_of_the_key_ties_excluded() -> None:
    config = History(of="movie", by="user", time="ts")
    events = [("u1", 10.0, "a"), ("u1", 20.0, "b"), ("u2", 5.0, "x"), ("u1", 20.0, "c"), ("u1", 30.0, "d")]
    state = _learn("history", config, [events[:2], events[2:]])
    rows = [("u1", 10.0), ("u1", 20.0), ("u1", 25.0), ("u1", 99.0), ("u3", 1.0), ("u1", math.inf)]
    assert HIST.apply(config, state, rows, 2) == [[], ["a"], ["b", "c"], ["c", "d"], [], ["c", "d"]]


def test_a_state_round_trips_through_its_file_and_is_held_to_the_spec(tmp_path) -> None:
    config = Vocabulary(min_count=1)
    state = _learn("vocabulary", config, [["a", "b", "b"]])
    learned = LearnedFeatures({"user": Learned("vocabulary", config, state)})
    path = tmp_path / "features.json"
    sha = learned.write(path)
    back = read_features(path, {"user": config}, sha)
    assert back.get("user").state.values == ["b", "a"]
    assert back.to_bytes() == path.read_bytes()
    with pytest.raises(ValueError) as error:
        read_features(path, {"user": Vocabulary(min_count=2)})
    assert str(error.value) == (
        f"{path}: feature 'user' was learned as vocabulary {{'min_count': 1, 'max_size': None, 'oov_buckets': 1}}, "
        "the spec says vocabulary {'min_count': 2, 'max_size': None, 'oov_buckets': 1}; learn the features again "
        "(reccompile data prepare, or train on the raw files without --resume)"
    )
    with pytest.raises(ValueError, match="its sha256 is not the one recorded"):
        read_features(path, {"user": config}, "0" * 64)


def test_counter_partials_are_plain_counts() -> None:
    assert VOCAB.fit(Vocabulary(), ["a", "a"]) == Counter({"a": 2})


def test_a_history_filtered_by_where_and_an_older_file_without_where_still_loads(tmp_path) -> None:
    config = History(of="movie", by="user", time="ts", where=("label", 1))
    events = [("u1", 10.0, "a", True), ("u1", 20.0, "b", False), ("u1", 30.0, "c", True)]
    state = _learn("history", config, [events[:1], events[1:]])
    assert HIST.apply(config, state, [("u1", 30.0), ("u1", 31.0)], 5) == [["a"], ["a", "c"]]
    plain = History(of="movie", by="user", time="ts")
    path = tmp_path / "features.json"
    plain_state = _learn("history", plain, [[event[:3] for event in events[:2]]])
    LearnedFeatures({"seen": Learned("history", plain, plain_state)}).write(path)
    document = json.loads(path.read_text())
    del document["features"]["seen"]["config"]["where"]  # as written before `where` existed
    path.write_text(json.dumps(document))
    assert read_features(path, {"seen": plain}).get("seen").state.keys == {"u1": ([10.0, 20.0], ["a", "b"])}
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: feature 'seen' was learned as history")):
        read_features(path, {"seen": config})


def test_dense_histories_of_one_key_write_the_training_rows_once_and_load_the_same(tmp_path) -> None:
    """Two aggregates of the same `by` and `time` hold the same keys, counts and times: the second refers to
    the first's, the file is smaller by them, and both load to states that give the same values."""
    rate = Aggregate(by="user", time="ts", aggregate="mean", of="label", last=3)
    count = Aggregate(by="user", time="ts", aggregate="count")
    events = [(f"u{i % 150}", float(i // 3), (), float(i % 2)) for i in range(1500)]
    learned = LearnedFeatures(
        {
            name: Learned("aggregate", config, _learn("aggregate", config, [events]))
            for name, config in (("rate", rate), ("count", count))
        }
    )
    path = tmp_path / "features.json"
    learned.write(path)
    stored = json.loads(path.read_text())["features"]
    assert {field: stored["count"]["state"][field] for field in ("keys", "counts", "times")} == {
        "keys": {"$same_as": ["rate", "keys"]},
        "counts": {"$same_as": ["rate", "counts"]},
        "times": {"$same_as": ["rate", "times"]},
    }
    alone = LearnedFeatures({"count": learned.get("count")}).to_bytes()
    assert len(path.read_bytes()) < len(alone) + len(LearnedFeatures({"rate": learned.get("rate")}).to_bytes())
    back = read_features(path, {"rate": rate, "count": count})
    rows = [(f"u{i}", 200.0, ()) for i in range(155)] + [("u3", math.inf, ())]
    for name, config in (("rate", rate), ("count", count)):
        expected = AGG.apply(config, learned.get(name).state, rows)
        assert torch.equal(AGG.apply(config, back.get(name).state, rows), expected), name
    assert back.to_bytes() == path.read_bytes()
    document = json.loads(path.read_text())
    document["features"]["count"]["state"]["keys"] = {"$same_as": ["nobody", "keys"]}
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError) as error:
        read_features(path, {"rate": rate, "count": count})
    assert str(error.value) == f"{path}: feature 'count' refers to ['nobody', 'keys'], which it does not hold"


def test_a_features_file_of_version_1_still_loads(tmp_path) -> None:
    config = Vocabulary(min_count=1)
    path = tmp_path / "features.json"
    LearnedFeatures({"user": Learned("vocabulary", config, _learn("vocabulary", config, [["a"]]))}).write(path)
    document = json.loads(path.read_text())
    assert document["version"] == 2
    document["version"] = 1
    path.write_text(json.dumps(document))
    assert read_features(path, {"user": config}).get("user").state.values == ["a"]
