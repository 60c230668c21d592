"""runtime/data/feature_columns.py: one id column fanned out to several features, dense columns bucketized,
the same in every reader (synthetic, criteo, csv, movielens, prepared)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sample_files import criteo_lines, movielens_spec, spec, write_lines, write_ml100k

from runtime.config.data import SparseFeatureConfig
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.columns import Columns, Jagged
from runtime.data.errors import DataError
from runtime.data.feature_columns import bucketize, read_inputs, to_features
from runtime.data.loader import epoch_batches
from runtime.data.prepared.prepare import PrepareSettings, prepare
from runtime.data.prepared.reading import RowReader, open_prepared
from runtime.data.sources import DataChoice, open_reader
from runtime.data.synthetic.batches import make_batch

BOUNDARIES = (0.5, 1.0, 2.0, 3.5)


def test_a_value_equal_to_a_boundary_goes_to_the_bucket_above() -> None:
    values = torch.tensor([-1.0, 0.5, 0.7, 1.0, 1.99, 2.0, 3.5, 9.0])
    assert bucketize(values, BOUNDARIES).tolist() == [0, 1, 1, 2, 2, 3, 4, 4]


def test_a_value_written_as_a_boundary_that_float32_cannot_hold_goes_to_the_bucket_above() -> None:
    values = torch.tensor([float(text) for text in ("0.05", "0.1", "0.3", "0.7", "0.9", "1.1", "2.2")])
    boundaries = (0.1, 0.3, 0.7, 0.9, 1.1, 2.2)  # float32(0.7) < 0.7 and float32(0.9) < 0.9
    assert bucketize(values, boundaries).tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_bucketize_is_torch_right_and_numpy_digitize_on_random_values() -> None:
    gen = torch.Generator().manual_seed(0)
    edges = tuple(sorted({round(x, 1) for x in torch.randn(30, generator=gen).tolist()}))  # decimals, as specs write
    values = torch.cat([torch.randn(1000, generator=gen) * 2, torch.tensor(edges)])  # every boundary itself too
    got = bucketize(values, edges)
    assert got.dtype == torch.int64
    assert torch.equal(got, torch.bucketize(values, torch.tensor(edges), right=True))
    float32_edges = np.array(edges, dtype=np.float32).astype(np.float64)
    assert got.tolist() == np.digitize(values.double().numpy(), float32_edges).tolist()
    assert got[1000:].tolist() == list(range(1, len(edges) + 1))


def _inputs(data: dict | None = None):
    cats = [{"name": f"cat_{i}", "table": f"cat_{i}"} for i in range(26)]
    wide = [{"name": f"wide_{i}", "table": f"wide_{i}", "column": f"cat_{i}"} for i in (0, 3)]
    buckets = [
        {"name": f"bucket_{i}", "table": f"bucket_{i}", "column": "int", "column_index": i, "boundaries": BOUNDARIES}
        for i in (0, 12)
    ]
    tables = {f"cat_{i}": 1000 for i in range(26)} | {"wide_0": 1000, "wide_3": 1000, "bucket_0": 5, "bucket_12": 5}
    return spec(
        [{"name": "int", "size": 13}],
        [*cats[:2], *wide[:1], *buckets, *cats[2:], *wide[1:]],
        tables,
        [{"name": "click", "label": "click", "loss": "bce"}],
        data,
    )


def _check_derived(batch, dense: torch.Tensor) -> None:
    keys = batch.sparse.keys()
    assert keys[:5] == ["cat_0", "cat_1", "wide_0", "bucket_0", "bucket_12"] and keys[-1] == "wide_3"
    assert len(keys) == 30
    for wide, cat in (("wide_0", "cat_0"), ("wide_3", "cat_3")):
        assert torch.equal(batch.sparse[wide].values(), batch.sparse[cat].values())
        assert torch.equal(batch.sparse[wide].lengths(), batch.sparse[cat].lengths())
    for name, column in (("bucket_0", 0), ("bucket_12", 12)):
        assert torch.equal(batch.sparse[name].values(), bucketize(dense[:, column], BOUNDARIES))
        assert batch.sparse[name].lengths().tolist() == [1] * dense.shape[0]


def test_readers_parse_only_the_features_that_read_their_own_column() -> None:
    inputs = _inputs()
    assert [f.name for f in read_inputs(inputs).sparse] == [f"cat_{i}" for i in range(26)]
    assert read_inputs(read_inputs(inputs)) == read_inputs(inputs)


def test_criteo_rows_fan_out_and_bucketize(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day_0", criteo_lines(40))
    reader = open_reader(_inputs(), DataChoice("criteo", str(path)))
    (local,) = epoch_batches(reader, global_batch=40, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=1)
    batch = local.batch
    assert len(set(bucketize(batch.dense["int"][:, 0], BOUNDARIES).tolist())) > 2  # the buckets are exercised
    _check_derived(batch, batch.dense["int"])


def test_prepared_data_stores_the_derived_features(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day_0", criteo_lines(40))
    inputs = _inputs()
    settings = PrepareSettings(row_group_rows=16, part_row_groups=2, workers=0, block_lines=10)
    prepare(inputs, DataChoice("criteo", str(path)), tmp_path / "out", settings)
    got = RowReader(open_prepared(inputs, tmp_path / "out")).read(0, 40).to_batch(False)
    (read,) = epoch_batches(
        open_reader(inputs, DataChoice("criteo", str(path))),
        global_batch=40,
        rank=0,
        world_size=1,
        bad_rows=BadRowLog("fail"),
        num_workers=0,
    )
    assert got.sparse.keys() == read.batch.sparse.keys()
    assert torch.equal(got.sparse.values(), read.batch.sparse.values())
    _check_derived(got, got.dense["int"])


def test_csv_columns_fan_out_and_bucketize(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "rows.csv", ["clicked,price,user", "1,2.0,3", "0,0.2,4", "1,3.6,3"])
    inputs = spec(
        [{"name": "price", "size": 1}],
        [
            {"name": "user", "table": "user"},
            {"name": "wide_user", "table": "wide_user", "column": "user"},
            {"name": "price_bucket", "table": "price_bucket", "column": "price", "boundaries": BOUNDARIES},
        ],
        {"user": 10, "wide_user": 10, "price_bucket": 5},
        [{"name": "click", "label": "click", "loss": "bce"}],
        {"reader": "csv", "path": str(path), "columns": {"clicked": "click", "price": "price", "user": "user"}},
    )
    reader = open_reader(inputs, DataChoice("csv", str(path)))
    (local,) = epoch_batches(reader, global_batch=3, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=0)
    sparse = local.batch.sparse
    assert sparse.keys() == ["user", "wide_user", "price_bucket"]
    assert sparse["wide_user"].values().tolist() == sparse["user"].values().tolist() == [3, 4, 3]
    assert sparse["price_bucket"].values().tolist() == [3, 0, 4]


@pytest.mark.parametrize("world_size", [1, 2])
def test_synthetic_batches_fan_out_and_bucketize_and_split_by_rank(world_size: int) -> None:
    inputs = _inputs()
    whole = make_batch(inputs, 8, step=3, seed=1)
    _check_derived(whole, whole.dense["int"])
    parts = [make_batch(inputs, 8, step=3, seed=1, rank=r, world_size=world_size) for r in range(world_size)]
    for key in whole.sparse.keys():
        assert torch.equal(torch.cat([p.sparse[key].values() for p in parts]), whole.sparse[key].values())


def test_synthetic_batches_without_derived_features_are_unchanged() -> None:
    inputs = read_inputs(_inputs())
    assert read_inputs(inputs) is inputs
    batch = make_batch(inputs, 8, step=0)
    assert batch.sparse.keys() == [f"cat_{i}" for i in range(26)]


def test_a_nan_to_bucketize_names_the_feature_row_and_column() -> None:
    inputs = _inputs()
    dense = torch.zeros(3, 13)
    dense[2, 12] = float("nan")
    columns = Columns(
        {"int": dense},
        {f"cat_{i}": Jagged.one_per_row(torch.zeros(3, dtype=torch.long)) for i in range(26)},
        {"click": torch.zeros(3)},
    )
    with pytest.raises(DataError) as caught:
        to_features(columns, inputs)
    assert str(caught.value) == (
        "feature 'bucket_12' (): row 2 of the batch has NaN in column 12 of dense feature 'int', which has no bucket"
    )


def test_movielens_ids_fan_out_to_the_wide_tables(tmp_path: Path) -> None:
    path = write_ml100k(tmp_path / "ml-100k")
    base = movielens_spec(genres=True)
    wide = [
        SparseFeatureConfig("wide_movie", "wide_movie", 50, column="movie_id"),
        SparseFeatureConfig("wide_genres", "wide_genres", 19, 6, False, True, column="genres"),
    ]
    inputs = dataclasses.replace(base, sparse=(*base.sparse, *wide))
    reader = open_reader(inputs, DataChoice("movielens", str(path)))
    (local,) = epoch_batches(reader, global_batch=10, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=0)
    sparse = local.batch.sparse
    assert sparse.keys() == ["user_id", "movie_id", "genres", "wide_movie", "wide_genres"]
    for wide_key, key in (("wide_movie", "movie_id"), ("wide_genres", "genres")):
        assert torch.equal(sparse[wide_key].values(), sparse[key].values())
        assert torch.equal(sparse[wide_key].lengths(), sparse[key].lengths())
        assert torch.equal(sparse[wide_key].weights(), sparse[key].weights())
    assert int(sparse["genres"].lengths().max()) == 2


def test_bucketizing_a_column_slice_warns_nobody() -> None:
    """A dense column is a slice of the batch's dense values: torch.bucketize warns once per process
    (a UserWarning a training run showed) on a non-contiguous input. In a process of its own: the
    warning is torch's once-only."""
    code = (
        "import torch; from runtime.data.feature_columns import bucketize; "
        "print(bucketize(torch.tensor([[0.1, 5.0], [0.7, 9.0]])[:, 0], (0.5, 0.7)).tolist())"
    )
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[0, 2]\n" and done.stderr == ""
