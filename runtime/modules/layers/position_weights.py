"""Position-weighted pooling: a bag's j-th id scaled by a learned weight j before pooling.

TorchRec's PositionWeightedModule as a block over looked-up rows: the
feature's table is looked up as rows (like a sequence table's), and this
module pools them with `runtime.sparse.sequence.pool_rows`, each row weighted
by the weight of its position in its bag. The weights are a dense parameter
of the model, one per position up to the feature's `max_ids`, starting at 1
(plain pooling); they train with the dense optimizer, and under
DistributedDataParallel their gradients are averaged like any dense
parameter's, so N ranks train what one process would.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.sparse.jagged import JaggedTensor
from runtime.sparse.sequence import pool_rows

__all__ = ["PositionWeightedPool", "PositionWeights", "positions"]


def positions(lengths: torch.Tensor) -> torch.Tensor:
    """The position of every id in its bag, 0 for the first: lengths [2, 3] -> [0, 1, 0, 1, 2]."""
    lengths = lengths.long()
    total = int(lengths.sum())
    starts = torch.cumsum(lengths, 0) - lengths
    return torch.arange(total, device=lengths.device) - starts.repeat_interleave(lengths, output_size=total)


class PositionWeightedPool(nn.Module):
    """[sum(L), D] rows with lengths [B] -> [B, D]: sum (or mean) of the rows, row j of a bag times weight j."""

    def __init__(self, max_ids: int, mode: str = "sum", feature: str = "", where: str = "") -> None:
        super().__init__()
        if max_ids < 1:
            raise ValueError(f"{where}: feature {feature!r}: max_ids must be >= 1 (got {max_ids})")
        self.max_ids = max_ids
        self.mode = mode
        self.feature = feature
        self.where = where
        self.weight = nn.Parameter(torch.ones(max_ids))

    def forward(self, rows: JaggedTensor) -> torch.Tensor:
        lengths = rows.lengths()
        if lengths.numel() and int(lengths.max()) > self.max_ids:
            raise ValueError(
                f"{self.where}: feature {self.feature!r}: a bag of {int(lengths.max())} ids is longer than its "
                f"{self.max_ids} position weights"
            )
        return pool_rows(rows, self.mode, self.weight[positions(lengths)])

    def extra_repr(self) -> str:
        return f"max_ids={self.max_ids}, mode={self.mode!r}"


class PositionWeights(nn.ModuleDict):
    """The position-weighted pools of a model, by feature name (the generated module's `_position_weights`)."""

    def __init__(self, pools: list[PositionWeightedPool]) -> None:
        super().__init__({pool.feature: pool for pool in pools})
