"""The field stack value: N field vectors of width D per sample, a [B, N, D] tensor.

Pooled embeddings (and blocks' outputs) stacked along a field axis are the
input of the blocks that model interactions between fields: FieldSelfAttention
(AutoInt), CIN (xDeepFM), Wukong, MaskNet. `Flatten` turns a stack back into
a pooled vector for the blocks that take [B, W]. `NumericEmbedding` makes a
stack of a dense feature's columns, one learned vector per column, as AutoInt
and FiBiNET embed numeric fields.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.modules.layers.arguments import check_size, owner

__all__ = ["Flatten", "NumericEmbedding", "check_stack"]


def check_stack(name: str, x: torch.Tensor, num_fields: int, dim: int) -> None:
    """Raise ValueError naming the block `name` unless x is (B, num_fields, dim)."""
    if x.dim() != 3 or x.shape[1] != num_fields or x.shape[2] != dim:
        raise ValueError(f"{name}: expected a field stack of shape (B, {num_fields}, {dim}), got {tuple(x.shape)}")


class Flatten(nn.Module):
    """[B, N, D] -> [B, N * D], field after field (row-major)."""

    def __init__(self, num_fields: int, dim: int, where: str = "") -> None:
        super().__init__()
        self.where = where
        name = owner("Flatten", where)
        self.num_fields = check_size(name, "num_fields", num_fields)
        self.dim = check_size(name, "dim", dim)
        self.out_features = self.num_fields * self.dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_stack(owner("Flatten", self.where), x, self.num_fields, self.dim)
        return x.reshape(x.shape[0], self.out_features)

    def extra_repr(self) -> str:
        return f"num_fields={self.num_fields}, dim={self.dim}"


class NumericEmbedding(nn.Module):
    """[B, size] -> [B, size, dim]: e[b, i] = x[b, i] * v_i (+ c_i with `bias`).

    Each column i has its own learned vector v_i (xavier-uniform over the
    [size, dim] matrix) and, with `bias`, its own learned offset c_i (zeros
    at the start), so a column's value scales its field's direction.
    """

    def __init__(self, size: int, dim: int, bias: bool = False, where: str = "") -> None:
        super().__init__()
        self.where = where
        name = owner("NumericEmbedding", where)
        self.size = check_size(name, "size", size)
        self.dim = check_size(name, "dim", dim)
        if not isinstance(bias, bool):
            raise ValueError(f"{name}: bias must be true or false (got {bias!r})")
        self.weight = nn.Parameter(torch.empty(self.size, self.dim))
        nn.init.xavier_uniform_(self.weight)
        self.bias = nn.Parameter(torch.zeros(self.size, self.dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.size:
            name = owner("NumericEmbedding", self.where)
            raise ValueError(f"{name}: expected input of shape (B, {self.size}), got {tuple(x.shape)}")
        stack = x.unsqueeze(2) * self.weight
        return stack + self.bias if self.bias is not None else stack

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}, bias={self.bias is not None}"
