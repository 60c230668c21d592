"""Shape checks shared by the sequence blocks, with messages naming the block.

Every sequence block takes a padded sequence [B, L, D] and its lengths [B]
(`runtime.sparse.sequence.to_padded` makes them from an EmbeddingCollection
output); positions at or after a sample's length are padding.
"""

from __future__ import annotations

import torch

__all__ = ["check_sequence"]


def check_sequence(owner: str, x: torch.Tensor, lengths: torch.Tensor, dim: int) -> None:
    """Raises ValueError unless x is [B, L, dim] and lengths is [B] with values in [0, L]."""
    if x.dim() != 3 or x.shape[2] != dim:
        raise ValueError(f"{owner}: expected a sequence of shape (B, L, {dim}), got {tuple(x.shape)}")
    if lengths.dim() != 1 or lengths.shape[0] != x.shape[0]:
        raise ValueError(f"{owner}: expected lengths of shape ({x.shape[0]},), got {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > x.shape[1]):
        raise ValueError(
            f"{owner}: lengths must be in [0, {x.shape[1]}] (got {int(lengths.min())} to {int(lengths.max())})"
        )
