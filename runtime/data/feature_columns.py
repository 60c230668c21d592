"""Data columns to features: one id column fanned out to several tables, numeric columns bucketized.

A sparse feature usually reads the column of its own name. With `column`
it reads another one (runtime.config.data.SparseFeatureConfig): another
sparse feature's ids, so one id column feeds several tables (the wide and
deep lookups of Wide&Deep and DeepFM), or, with `boundaries`, one column of
a dense feature, bucketized into one id per sample.

Every reader parses the columns it is asked for (`read_inputs`: the features
that read their own column) and ends with `to_features`, which builds the
features in the spec's order. Doing it here, in the data rather than in the
model graph, means that prepared data (runtime.data.prepared) stores the
bucket ids, that the model, the pipeline's stage 0 and the exported program
see plain ids like any others, and that training, `reccompile predict` and
evaluation share one function.

Bucketizing follows `torch.bucketize(x, boundaries, right=True)`: with
boundaries b0 < ... < b(n-1), x gets id i when b(i-1) <= x < b(i), so a
value equal to a boundary goes to the bucket above it (numpy's `digitize`,
TensorFlow's `bucketized_column`); below b0 is id 0, from b(n-1) up id n.
Values and boundaries are compared in float32, the precision of dense columns.
"""

from __future__ import annotations

import dataclasses

import torch

from runtime.config.data import ModelInputs, SparseFeatureConfig
from runtime.config.transforms import Quantiles
from runtime.data.columns import Columns, Jagged
from runtime.data.errors import DataError

__all__ = ["FeatureReader", "bucketize", "derives", "read_inputs", "to_features"]


def _reads_own(feature: SparseFeatureConfig) -> bool:
    """Whether the reader makes the feature's ids: its own column, or learned quantiles of a dense column
    (taken of the raw values, runtime.features.quantiles, which only the table reader sees)."""
    return feature.column is None or isinstance(feature.transform, Quantiles)


def derives(inputs: ModelInputs) -> bool:
    """Whether some feature reads a column other than its own."""
    return not all(_reads_own(feature) for feature in inputs.sparse)


def read_inputs(inputs: ModelInputs) -> ModelInputs:
    """The inputs a reader parses: the sparse features that read their own column."""
    if not derives(inputs):
        return inputs
    own = tuple(feature for feature in inputs.sparse if _reads_own(feature))
    return dataclasses.replace(inputs, sparse=own)


def bucketize(values: torch.Tensor, boundaries: tuple[float, ...]) -> torch.Tensor:
    """int64 bucket ids of `values` (see the module docstring for the side a boundary goes to).

    The boundaries are rounded to the values' own precision (float32, as every
    reader parses dense columns), as `torch.bucketize` on such a tensor with
    `torch.tensor(boundaries)` would: a value written as a boundary is then
    equal to it. Compared in float64 instead, float32(0.7) < 0.7 put a
    value of exactly 0.7 in the bucket below."""
    # contiguous: torch warns (once, to the user) and copies anyway for a column slice
    return torch.bucketize(values.contiguous(), torch.tensor(boundaries, dtype=values.dtype), right=True)


def to_features(columns: Columns, inputs: ModelInputs) -> Columns:
    """`columns` (as read for `read_inputs(inputs)`) with every sparse feature of `inputs`, in its order,
    followed by the keys that are no sparse feature (timestamps)."""
    if not derives(inputs):
        return columns
    names = {feature.name for feature in inputs.sparse}
    sparse = {feature.name: _feature(columns, feature) for feature in inputs.sparse}
    sparse.update({key: jagged for key, jagged in columns.sparse.items() if key not in names})
    return Columns(columns.dense, sparse, columns.labels)


def _feature(columns: Columns, feature: SparseFeatureConfig) -> Jagged:
    if _reads_own(feature):
        return columns.sparse[feature.name]
    if not feature.boundaries:
        return columns.sparse[feature.column]
    values = columns.dense[feature.column][:, feature.column_index]
    bad = torch.isnan(values)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        raise DataError(
            f"feature {feature.name!r} ({feature.where}): row {row} of the batch has NaN in column "
            f"{feature.column_index} of dense feature {feature.column!r}, which has no bucket"
        )
    return Jagged.one_per_row(bucketize(values, feature.boundaries))


class FeatureReader:
    """A file reader (runtime.data.loader.Reader) of `read_inputs(inputs)` whose columns end as `inputs`'
    features; every other attribute is the wrapped reader's."""

    def __init__(self, reader: object, inputs: ModelInputs) -> None:
        self.inner = reader
        self.inputs = inputs

    def __getattr__(self, name: str) -> object:
        if name in ("inner", "inputs"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def to_columns(self, rows: list) -> Columns:
        return to_features(self.inner.to_columns(rows), self.inputs)  # type: ignore[attr-defined]
