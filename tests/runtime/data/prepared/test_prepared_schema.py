"""runtime/data/prepared/schema.py: rows to Arrow and back, through chunked and sliced tables."""

from __future__ import annotations

import torch

from runtime.config.data import DenseFeatureConfig, ModelInputs, SparseFeatureConfig
from runtime.config.heads import HeadConfig
from runtime.config.training import TrainingConfig
from runtime.data.columns import Columns, Jagged
from runtime.data.files.arrow import pa
from runtime.data.prepared.schema import column_specs, from_table, to_table


def _inputs() -> ModelInputs:
    sparse = (SparseFeatureConfig("a", "a", 50), SparseFeatureConfig("b", "b", 50, weighted=True))
    return ModelInputs(
        (DenseFeatureConfig("int", 3),), sparse, (HeadConfig("click", "bce", "click"),), TrainingConfig(1, 4, 0)
    )


def _columns(rows: int, seed: int) -> Columns:
    generator = torch.Generator().manual_seed(seed)
    dense = {"int": torch.rand(rows, 3, generator=generator)}
    sparse = {}
    for key in ("a", "b"):
        lengths = torch.randint(0, 4, (rows,), generator=generator)
        values = torch.randint(0, 50, (int(lengths.sum()),), generator=generator)
        weights = torch.rand(values.numel(), generator=generator) if key == "b" else None
        sparse[key] = Jagged(lengths, values, weights)
    return Columns(dense, sparse, {"click": torch.randint(0, 2, (rows,), generator=generator).float()})


def _assert_equal(got: Columns, want: Columns) -> None:
    assert list(got.sparse) == list(want.sparse)
    assert torch.equal(got.dense["int"], want.dense["int"])
    assert torch.equal(got.labels["click"], want.labels["click"])
    for key, jagged in want.sparse.items():
        assert torch.equal(got.sparse[key].lengths, jagged.lengths)
        assert torch.equal(got.sparse[key].values, jagged.values)
        assert torch.equal(got.sparse[key].weights_or_ones(), jagged.weights_or_ones())


def test_a_table_of_several_chunks_sliced_across_them_reads_back_its_rows() -> None:
    specs = column_specs(_inputs())
    first, second = _columns(7, seed=1), _columns(9, seed=2)
    table = pa.concat_tables([to_table(first, specs), to_table(second, specs)])
    assert table.column("sparse.a").num_chunks == 2
    sliced = table.slice(3, 10)  # rows 3..6 of the first chunk, 0..5 of the second
    _assert_equal(from_table(sliced, specs), Columns.concat([first, second]).slice(3, 13))


def test_read_columns_are_writable_tensors_of_their_own() -> None:
    specs = column_specs(_inputs())
    table = to_table(_columns(5, seed=3), specs)
    columns = from_table(table.slice(1, 3), specs)
    columns.sparse["a"].values.add_(1)  # a view of Arrow's read-only buffers would refuse or change the table
    columns.dense["int"].mul_(2)
    _assert_equal(from_table(table.slice(1, 3), specs), _columns(5, seed=3).slice(1, 4))


def test_an_empty_slice_reads_as_no_rows() -> None:
    specs = column_specs(_inputs())
    columns = from_table(to_table(_columns(4, seed=4), specs).slice(4, 0), specs)
    assert len(columns) == 0
    assert columns.sparse["a"].values.dtype == torch.int64
    assert columns.dense["int"].shape == (0, 3)
