"""Embedding tables laid out over ranks by a sharding plan (see sparse_arch.py).

The names below load on first use (PEP 562), so that importing the torch-free
`runtime.sharding.types`, as the compiler's planner does, loads no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SparseArch": "runtime.sharding.sparse_arch",
    "distribute_dense": "runtime.sharding.dense",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'runtime.sharding' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
