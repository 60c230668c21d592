"""The sharding types and compute kernels: named once, for the planner and the runtime.

Plain data, no torch: the compiler imports this module (and only this one)
from the runtime for them, so what the planner may put in a plan and what
the runtime builds are the same lists. The compute kernels belong to the
embeddings layer below (runtime/embeddings/kernels.py) and are re-exported
here, so that layer never imports this one.

SHARDING_TYPES is also the order of the sparse groups: SparseArch builds one
group per sharding type present in a plan, in this order, and the lowering
orders the pooled embeddings the same way.
"""

from __future__ import annotations

from typing import Literal

from runtime.embeddings.kernels import COMPUTE_KERNELS, FUSED_DIM_MULTIPLE, ComputeKernel, kernel_fits

__all__ = [
    "COMPUTE_KERNELS",
    "FUSED_DIM_MULTIPLE",
    "ROW_SHARDED",
    "SHARDING_TYPES",
    "ComputeKernel",
    "ShardingType",
    "kernel_fits",
]

ShardingType = Literal["data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise"]

SHARDING_TYPES: tuple[ShardingType, ...] = (
    "data_parallel",
    "table_wise",
    "column_wise",
    "row_wise",
    "table_row_wise",
)
ROW_SHARDED: tuple[ShardingType, ...] = ("row_wise", "table_row_wise")
