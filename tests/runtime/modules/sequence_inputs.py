"""Random padded sequences for the sequence-block tests: padding holds noise, not zeros."""

from __future__ import annotations

import torch

LENGTHS = [3, 0, 6, 1, 6]


def padded_batch(
    dim: int, lengths: list[int] = LENGTHS, length: int = 6, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, length, dim] normal values everywhere (so a leak of padding shows) and the lengths."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(len(lengths), length, dim, generator=gen), torch.tensor(lengths)
