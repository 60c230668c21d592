"""runtime/data/tables/parquet_files.py: Parquet columns, list columns as sequences, mapped by data.columns."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sample_files import spec
from test_csv_files import COLUMNS, _hashed, _inputs

from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches
from runtime.data.sources import DataChoice, choose_data, open_reader


def _write(path: Path) -> Path:
    table = pa.table(
        {
            "clicked": pa.array([1.0, 0.0, 1.0, None], pa.float32()),
            "price": [2.5, None, 100.0, 1.0],
            "age": [40, 7, 1, 3],
            "user": ["alice", "bob", "alice", "carol"],
            "item": [17, -3, None, 2],
            "seen": pa.array([[3, 4, 5], [], [9], []], pa.list_(pa.int64())),
            "seen_at": pa.array([[10, 20, 30], [], [50], []], pa.list_(pa.int64())),
            "unused": ["x", "y", "z", "w"],
        }
    )
    pq.write_table(table, path)
    return path


def _parquet_inputs(path: Path, columns: dict[str, str] = COLUMNS):
    inputs = _inputs(path, columns)
    return dataclasses.replace(inputs, data=dataclasses.replace(inputs.data, reader="parquet"))


def test_list_columns_feed_sequences_and_scalars_feed_the_rest(tmp_path: Path) -> None:
    path = _write(tmp_path / "clicks.parquet")
    inputs = _parquet_inputs(path)
    reader = open_reader(inputs, choose_data(None, inputs))
    bad = BadRowLog("skip")
    (local,) = epoch_batches(reader, global_batch=3, rank=0, world_size=1, bad_rows=bad, num_workers=0)
    batch = local.batch
    assert batch.dense["num"].tolist() == [[2.5, 40.0], [0.0, 7.0], [100.0, 1.0]]
    assert batch.labels["click"].tolist() == [1.0, 0.0, 1.0]
    assert batch.sparse["user"].values().tolist() == [_hashed("alice", 50), _hashed("bob", 50), _hashed("alice", 50)]
    assert batch.sparse["item"].values().tolist() == [17, -3 % 100, 0]
    assert batch.sparse["history"].values().tolist() == [4, 5, 9]
    assert batch.sparse["history_time"].values().tolist() == [20, 30, 50]
    assert [str(row) for row in bad.examples] == [f"{path}:4: column clicked: a label must not be empty (value '')"]


def test_a_missing_column_is_named_with_its_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "clicks.parquet")
    with pytest.raises(DataError) as error:
        moved = {**{k: v for k, v in COLUMNS.items() if k != "clicked"}, "nowhere": "click"}
        open_reader(_parquet_inputs(path, moved), DataChoice("parquet", str(path)))
    assert str(error.value) == f"{path}: no column 'nowhere' (data.columns maps it)"


def test_a_list_longer_than_max_ids_per_sample_is_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "bags.parquet"
    pq.write_table(
        pa.table({"tags": pa.array([[1, 2], [1, 2, 3, 4], []], pa.list_(pa.int64())), "clicked": [1.0, 0.0, 1.0]}), path
    )
    inputs = spec(
        [],
        [{"name": "tags", "table": "tags", "ids_per_sample": 3, "fixed_ids": False}],
        {"tags": 10},
        [{"name": "click", "label": "click", "loss": "bce"}],
        {"reader": "parquet", "path": str(path), "columns": {"tags": "tags", "clicked": "click"}},
    )
    bad = BadRowLog("skip")
    (local,) = epoch_batches(
        open_reader(inputs, choose_data(None, inputs)),
        global_batch=2,
        rank=0,
        world_size=1,
        bad_rows=bad,
        num_workers=0,
    )
    assert local.batch.sparse["tags"].lengths().tolist() == [2, 0]
    assert [str(row) for row in bad.examples] == [
        f"{path}:2: column tags: 4 ids, but feature 'tags' takes at most 3 (max_ids_per_sample) (value '[1, 2, 3, 4]')"
    ]
