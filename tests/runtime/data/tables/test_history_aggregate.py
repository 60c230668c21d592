"""A dense `history`: an aggregate of a key's strictly earlier training rows (mean of a column, or count),
against a plain-Python reference on a generated table with ties in time, `last`, `sharing`, keys of two
columns and empty histories; learned from the training rows only, so a held-out row's label changes no value."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
import torch

from compiler.lowering.instantiate import model_inputs
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.loader import epoch_batches
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.learn import learn_features
from runtime.serving.online.raw_rows import raw_rows

# name: (by, aggregate, of, last, sharing)
AGGREGATES = {
    "rate": ("user", "mean", "label", None, None),
    "rate_3": ("user", "mean", "label", 3, None),
    "genre_rate": ("user", "mean", "label", None, "genres"),
    "genre_rate_4": ("user", "mean", "label", 4, "genres"),
    "score_mean": ("user", "mean", "score", 5, None),
    "item_count": ("item", "count", None, None, None),
    "genre_count_2": ("user", "count", None, 2, "genres"),
    "item_user_rate": (["item", "user"], "mean", "label", None, None),
    "user_item_count_2": (["user", "item"], "count", None, 2, None),
}


def _spec(shaped: bool) -> str:
    lines = []
    for name, (by, aggregate, of, last, sharing) in AGGREGATES.items():
        options = [
            f"by: [{', '.join(by)}]" if isinstance(by, list) else f"by: {by}",
            "time: ts",
            f"aggregate: {aggregate}",
        ]
        options += [f"of: {of}"] if of else []
        options += [f"last: {last}"] if last else []
        options += [f"sharing: {sharing}"] if sharing else []
        shaping = ", transform: {log: true, scale: standardize}" if shaped else ""
        lines.append(f"    - {{name: {name}, size: 1, history: {{{', '.join(options)}}}{shaping}}}")
    return f"""\
version: 1
name: aggregates
features:
  dense:
    - {{name: score, size: 1}}
{chr(10).join(lines)}
  sparse:
    - {{name: user, num_embeddings: 64, dim: 4}}
    - {{name: item, num_embeddings: 64, dim: 4}}
    - {{name: genres, num_embeddings: 16, dim: 4, max_ids_per_sample: 3, pooling: mean}}
model:
  top: {{type: mlp, input: [sparse.user, sparse.item, dense.score], layers: [1]}}
heads:
  - {{name: click, input: top, loss: bce}}
training: {{batch_size: 7}}
data:
  reader: csv
  path: train.csv
  columns: {{user: user, item: item, genres: genres, score: score, label: click}}
"""


HEADER = "user,item,genres,score,ts,label"
GENRES = ["a", "b", "c", "d", "e"]


def _table(rows: int, seed: int) -> list[list[str]]:
    """Rows (user, item, genres, score, ts, label): few users and times, so ties and empty histories occur;
    some genres and scores are empty."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        genres = "|".join(rng.sample(GENRES, rng.randint(0, 2)))
        score = "" if rng.random() < 0.1 else f"{rng.uniform(-2, 3):.3f}"
        label = str(int(rng.random() < 0.6))
        out.append([f"u{rng.randint(0, 5)}", f"i{rng.randint(0, 8)}", genres, score, str(rng.randint(0, 12)), label])
    return out


def _reference(train: list[list[str]], row: list[str], config: tuple) -> float:
    """The aggregate of `row` over the training rows, the slow and obvious way."""
    by, aggregate, of, last, sharing = config
    column = HEADER.split(",")
    keys, time = [column.index(c) for c in (by if isinstance(by, list) else [by])], column.index("ts")
    earlier = sorted(
        (r for r in train if all(r[k] == row[k] for k in keys) and int(r[time]) < int(row[time])),
        key=lambda r: int(r[time]),
    )
    if last is not None:
        earlier = earlier[-last:]
    if sharing is not None:
        own = set(filter(None, row[2].split("|")))
        earlier = [r for r in earlier if own & set(filter(None, r[2].split("|")))]
    if aggregate == "count":
        return float(len(earlier))
    values = [float(r[column.index(of)]) for r in earlier if r[column.index(of)] != ""]
    every = [float(r[column.index(of)]) for r in train if r[column.index(of)] != ""]
    return sum(values) / len(values) if values else sum(every) / len(every)


def _values(
    root: Path, train: list[list[str]], test: list[list[str]], shaped: bool = False, served: bool = False
) -> dict[str, list[float]]:
    """Per aggregate feature, the values of the test rows (as the loader batches them, or with `served` as a
    server's request of their raw columns makes them), learned from `train`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "spec.yaml").write_text(_spec(shaped))
    (root / "train.csv").write_text("\n".join([HEADER, *(",".join(r) for r in train)]) + "\n")
    (root / "test.csv").write_text("\n".join([HEADER, *(",".join(r) for r in test)]) + "\n")
    inputs = model_inputs(validate(load(str(root / "spec.yaml"))))
    learned = learn_features(open_reader(inputs, DataChoice("csv", str(root / "train.csv"))), progress=False)
    inputs = dataclasses.replace(inputs, learned=learned)
    if served:
        rows = raw_rows(inputs, None)
        names = [raw.name for raw in rows.inputs]
        assert "label" not in names  # a request carries no label
        columns = {name: [row[HEADER.split(",").index(name)] or None for row in test] for name in names}
        batch = rows.batch(rows.parse(columns, len(test)))
        return {name: batch.dense[name].reshape(-1).tolist() for name in AGGREGATES}
    reader = open_reader(inputs, DataChoice("csv", str(root / "test.csv")))
    batches = epoch_batches(reader, global_batch=7, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=0)
    out: dict[str, list[float]] = {name: [] for name in AGGREGATES}
    for local in batches:
        for name in AGGREGATES:
            out[name] += local.batch.dense[name].reshape(-1).tolist()
    return out


@pytest.fixture(scope="module")
def table() -> tuple[list[list[str]], list[list[str]]]:
    return _table(120, seed=0), _table(40, seed=1)


def test_the_aggregates_of_held_out_rows_are_the_reference(tmp_path: Path, table: tuple) -> None:
    train, test = table
    got = _values(tmp_path, train, test)
    for name, config in AGGREGATES.items():
        expected = [_reference(train, row, config) for row in test]
        assert got[name] == pytest.approx(expected, abs=1e-5), name
    assert 0.0 in got["item_count"] and any(v > 2 for v in got["item_count"])  # empty and long histories
    assert 0.0 in got["user_item_count_2"] and 2.0 in got["user_item_count_2"]  # a pair's rows, not its user's


def test_a_served_request_gets_the_loaders_values(tmp_path: Path, table: tuple) -> None:
    train, test = table
    assert _values(tmp_path / "a", train, test, shaped=True, served=True) == _values(tmp_path / "b", train, test, True)


def test_a_training_row_sees_only_the_training_rows_strictly_before_it(tmp_path: Path, table: tuple) -> None:
    """The training file read back through its own state: a row never counts itself nor a row of its time."""
    train, _ = table
    got = _values(tmp_path, train, train)
    for name, config in AGGREGATES.items():
        assert got[name] == pytest.approx([_reference(train, row, config) for row in train], abs=1e-5), name


def test_the_shaping_is_learned_on_the_training_rows_aggregates(tmp_path: Path, table: tuple) -> None:
    """log then standardize, with the mean and std of the training rows' own (logged) aggregates."""
    train, test = table
    got = _values(tmp_path, train, test, shaped=True)
    for name, config in AGGREGATES.items():
        own = torch.tensor([_reference(train, row, config) for row in train], dtype=torch.float64)
        own = torch.log1p(own.clamp_min(0.0))  # log takes a value below 0 as 0
        mean, std = own.mean(), own.std(unbiased=False)
        held = torch.tensor([_reference(train, row, config) for row in test], dtype=torch.float64)
        held = torch.log1p(held.clamp_min(0.0))
        expected = ((held - mean) / (std if std > 0 else 1.0)).tolist()
        assert got[name] == pytest.approx(expected, abs=1e-4), name


def test_a_held_out_rows_label_changes_no_aggregate(tmp_path: Path, table: tuple) -> None:
    train, test = table
    flipped = [[*row[:5], str(1 - int(row[5]))] for row in test]
    rescored = [[*row[:3], "" if row[3] else "9.5", *row[4:]] for row in test]
    first = _values(tmp_path / "a", train, test)
    assert first == _values(tmp_path / "b", train, flipped) == _values(tmp_path / "c", train, rescored)
    assert not math.isnan(sum(sum(values) for values in first.values()))
