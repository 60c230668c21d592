"""The columns of prepared data: named per feature, typed per kind, described per spec.

A spec's inputs (runtime.config.data.ModelInputs) become these Parquet columns:

    dense.<feature>    fixed_size_list<float32>[size]   the feature's values, as the reader made them
    sparse.<feature>   list<int64>                       table rows (and timestamps features' times)
    weight.<feature>   list<float32>                     per-id weights, every sparse key of a weighted spec
    label.<label>      float32                           a head's label

`column_specs` says what each column was made for (its table's rows, its
sequence length, its head's loss): the manifest keeps it, and training
compares it column by column, so data prepared for another spec is refused
with the column that differs. Its sha256 (`spec_digest`) is the manifest's
spec hash: the same for two specs whose data would be prepared alike, even
when their models differ.

>>> inputs = ModelInputs((DenseFeatureConfig("int", 2),), (SparseFeatureConfig("c", "c", 10),),
...                       (HeadConfig("click", "bce", "click"),), TrainingConfig(1, 4, 0))
>>> list(column_specs(inputs))
['dense.int', 'sparse.c', 'label.click']
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import torch

from runtime.config.data import ModelInputs, SparseFeatureConfig
from runtime.config.transforms import config_json
from runtime.data.columns import Columns, Jagged
from runtime.data.files.arrow import pa
from runtime.data.spec_columns import heads_by_label, is_weighted

DENSE, SPARSE, WEIGHT, LABEL = "dense.", "sparse.", "weight.", "label."


def column_specs(inputs: ModelInputs) -> dict[str, dict[str, Any]]:
    """Column name -> what the spec makes of it, in batch order (dense, sparse keys, weights, labels)."""
    specs: dict[str, dict[str, Any]] = {}
    for dense in inputs.dense:
        specs[DENSE + dense.name] = {"kind": "dense", "size": dense.size, **_transform(dense.transform)}
    for sparse in inputs.sparse:
        specs[SPARSE + sparse.name] = _sparse_spec(sparse)
    for stamps in inputs.timestamps:
        specs[SPARSE + stamps.name] = {"kind": "timestamps", "sequence": stamps.sequence}
    if is_weighted(inputs):
        for key in [*(f.name for f in inputs.sparse), *(t.name for t in inputs.timestamps)]:
            specs[WEIGHT + key] = {"kind": "weights", "of": key}
    for label, head in heads_by_label(inputs).items():
        specs[LABEL + label] = {"kind": "label", "loss": head.loss}
    return specs


def _sparse_spec(feature: SparseFeatureConfig) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "sparse", "table_rows": feature.num_embeddings}
    if feature.max_length is not None:
        spec.update(max_length=feature.max_length, keep=feature.keep)
    return {**spec, **_transform(feature.transform)}


def _transform(config: Any) -> dict[str, Any]:
    """A learned transform's kind and config (runtime.config.transforms), so data prepared with another is refused."""
    return {} if config is None else {"transform": {"kind": config.kind, **config_json(config)}}


def spec_digest(specs: dict[str, dict[str, Any]]) -> str:
    """The sha256 of the column specs: the spec hash of a manifest."""
    text = json.dumps(specs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def arrow_type(spec: dict[str, Any]) -> pa.DataType:
    """The Arrow type of a column of this spec."""
    kind = spec["kind"]
    if kind == "dense":
        return pa.list_(pa.float32(), spec["size"])
    if kind == "weights":
        return pa.list_(pa.float32())
    if kind == "label":
        return pa.float32()
    return pa.list_(pa.int64())


def arrow_schema(specs: dict[str, dict[str, Any]]) -> pa.Schema:
    return pa.schema([pa.field(name, arrow_type(spec), nullable=False) for name, spec in specs.items()])


def to_table(columns: Columns, specs: dict[str, dict[str, Any]]) -> pa.Table:
    """Parsed rows as an Arrow table of `specs`' columns (a reader's Columns must hold them all)."""
    arrays = []
    for name, spec in specs.items():
        kind, key = spec["kind"], name.partition(".")[2]
        if kind == "dense":
            values = columns.dense[key].to(torch.float32).contiguous().numpy().reshape(-1)
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), spec["size"]))
        elif kind == "label":
            arrays.append(pa.array(columns.labels[key].to(torch.float32).numpy(), pa.float32()))
        elif kind == "weights":
            jagged = columns.sparse[key]
            arrays.append(_list_array(jagged.lengths, jagged.weights_or_ones().to(torch.float32), pa.float32()))
        else:
            jagged = columns.sparse[key]
            arrays.append(_list_array(jagged.lengths, jagged.values, pa.int64()))
    return pa.Table.from_arrays(arrays, schema=arrow_schema(specs))


def _list_array(lengths: torch.Tensor, values: torch.Tensor, kind: pa.DataType) -> pa.Array:
    offsets = np.zeros(lengths.numel() + 1, dtype=np.int32)
    np.cumsum(lengths.numpy(), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values.numpy(), kind))


def from_table(table: pa.Table, specs: dict[str, dict[str, Any]]) -> Columns:
    """An Arrow table of `specs`' columns as `Columns` (sparse keys in `specs`' order).

    Each column's chunks are read through their buffers (zero-copy numpy views)
    and copied once, into the tensor that holds them: this runs for every
    batch a rank trains, so it avoids Arrow's combine, flatten and cast."""
    dense: dict[str, torch.Tensor] = {}
    sparse: dict[str, Jagged] = {}
    labels: dict[str, torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}
    for name, spec in specs.items():
        kind, key = spec["kind"], name.partition(".")[2]
        chunks = table.column(name).chunks
        if kind == "dense":
            flat = _joined([chunk.flatten().to_numpy() for chunk in chunks], np.float32)
            dense[key] = torch.from_numpy(flat.reshape(-1, spec["size"]))
        elif kind == "label":
            labels[key] = torch.from_numpy(_joined([chunk.to_numpy() for chunk in chunks], np.float32))
        else:
            lengths, values = _lists(chunks, np.float32 if kind == "weights" else np.int64)
            if kind == "weights":
                weights[key] = torch.from_numpy(values)
            else:
                sparse[key] = Jagged(torch.from_numpy(lengths), torch.from_numpy(values), None)
    for key, values in weights.items():
        sparse[key] = Jagged(sparse[key].lengths, sparse[key].values, values)
    return Columns(dense, sparse, labels)


def _lists(chunks: list[pa.ListArray], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Row lengths (int64) and values of list chunks, each joined into one new array."""
    lengths, values = [], []
    for chunk in chunks:
        offsets = chunk.offsets.to_numpy()  # a sliced chunk's offsets index its unsliced values
        lengths.append(np.diff(offsets))
        values.append(chunk.values.to_numpy()[offsets[0] : offsets[-1]])
    return _joined(lengths, np.int64), _joined(values, dtype)


def _joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """`parts` one after the other in a new, writable array (torch.from_numpy shares it)."""
    if not parts:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=False) if len(parts) > 1 else parts[0].astype(dtype, copy=True)
