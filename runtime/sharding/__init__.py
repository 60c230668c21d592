"""Embedding tables laid out over ranks by a sharding plan (see sparse_arch.py)."""

from runtime.sharding.dense import distribute_dense
from runtime.sharding.sparse_arch import SHARDING_TYPE_ORDER, SparseArch

__all__ = ["SHARDING_TYPE_ORDER", "SparseArch", "distribute_dense"]
