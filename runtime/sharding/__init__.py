"""Embedding tables laid out over ranks by a sharding plan (see sparse_arch.py).

The names below load on first use (PEP 562), so that importing the torch-free
`runtime.sharding.types`, as the compiler's planner does, loads no torch.
"""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "sparse_arch": ("SparseArch",),
        "dense": ("DenseDataParallel", "distribute_dense"),
        "layout": ("Shard", "TableLayout", "table_layouts"),
        "types": ("SHARDING_TYPES", "COMPUTE_KERNELS"),
    },
)
