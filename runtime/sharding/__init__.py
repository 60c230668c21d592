"""Embedding tables laid out over ranks by a sharding plan (see sparse_arch.py)."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "sparse_arch": ("SHARDING_TYPE_ORDER", "SparseArch"),
        "dense": ("DenseDataParallel", "distribute_dense"),
        "layout": ("Shard", "TableLayout", "table_layouts"),
    },
)
