"""The compute kernels an EmbeddingBagCollection builds, named once; no torch.

`fused`: fbgemm's table-batched kernel with the optimizer fused into
backward, for tables whose dim is a multiple of FUSED_DIM_MULTIPLE.
`dense`: one torch.nn.EmbeddingBag per table, the reference; any dim.

The planner reads these through runtime.sharding.types, so it never puts a
kernel in a plan that this layer cannot build.
"""

from __future__ import annotations

from typing import Literal

ComputeKernel = Literal["fused", "dense"]

COMPUTE_KERNELS: tuple[ComputeKernel, ...] = ("fused", "dense")
FUSED_DIM_MULTIPLE = 4  # fbgemm's fused kernel stores rows of a multiple of 4 floats


def kernel_fits(kernel: str, dim: int) -> bool:
    """Whether `kernel` can hold a table (or column shard) `dim` wide."""
    return kernel != "fused" or dim % FUSED_DIM_MULTIPLE == 0


def check_compute_kernel(kernel: str) -> None:
    """ValueError naming the kernels there are, for a collection asked for another."""
    if kernel not in COMPUTE_KERNELS:
        raise ValueError(f"unknown compute_kernel {kernel!r}; expected one of {', '.join(COMPUTE_KERNELS)}")
