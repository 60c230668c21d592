"""SequencePool: a padded sequence reduced to one vector per sample (the `sequence_pool` block).

Takes [B, L, D] with lengths [B] and returns [B, D]: the sum, mean, max,
first or last of the real positions; an empty sequence gives zeros in every
mode. `first` reads position 0, where a transformer's `prepend` puts the target.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.modules.blocks.pooled import _check_size
from runtime.modules.layers.sequence_checks import check_sequence
from runtime.sparse.sequence import padding_mask

__all__ = ["POOL_MODES", "SequencePool"]

POOL_MODES = ("sum", "mean", "max", "first", "last")


class SequencePool(nn.Module):
    """Pools the real positions of each sequence: (B, L, dim), (B,) -> (B, dim)."""

    def __init__(self, dim: int, mode: str = "mean") -> None:
        super().__init__()
        self.dim = _check_size("SequencePool", "dim", dim)
        if mode not in POOL_MODES:
            raise ValueError(f"SequencePool: unknown mode {mode!r} (expected one of: {', '.join(POOL_MODES)})")
        self.mode = mode

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        check_sequence("SequencePool", x, lengths, self.dim)
        if self.mode == "first":
            return x[:, 0] * (lengths > 0).unsqueeze(1).to(x.dtype)
        if self.mode == "last":
            index = (lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, self.dim)
            last = x.gather(1, index).squeeze(1)
            return last * (lengths > 0).unsqueeze(1).to(x.dtype)
        mask = padding_mask(lengths, x.shape[1]).unsqueeze(2)
        if self.mode == "max":
            pooled = x.masked_fill(~mask, float("-inf")).amax(dim=1)
            return pooled.masked_fill((lengths == 0).unsqueeze(1), 0.0)
        pooled = (x * mask.to(x.dtype)).sum(dim=1)
        if self.mode == "mean":
            pooled = pooled / lengths.clamp(min=1).unsqueeze(1).to(x.dtype)
        return pooled

    def extra_repr(self) -> str:
        return f"dim={self.dim}, mode={self.mode!r}"
