"""Elementwise blocks: `Product` of equal-shaped inputs (gating, ESMM's p(ctr) * p(cvr)) and `Activation`.

Both sit beside `Sum` (runtime/modules/blocks/pooled.py) in the graph: they take
pooled vectors [B, W] or field stacks [B, N, D] alike and keep the shape.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from runtime.modules.blocks.pooled import _check_same_shapes
from runtime.modules.layers.arguments import owner

__all__ = ["ACTIVATION_FUNCTIONS", "Activation", "Product"]

# Out-of-place: the input of an activation block may feed other blocks too.
ACTIVATION_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "tanh": torch.tanh,
}


class Product(nn.Module):
    """Elementwise product x_1 * ... * x_k of equal-shaped tensors."""

    def __init__(self, where: str = "") -> None:
        super().__init__()
        self.where = where

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        _check_same_shapes(owner("Product", self.where), xs)
        product = xs[0]
        for x in xs[1:]:
            product = product * x  # out of place: mul's backward needs both factors
        return product


class Activation(nn.Module):
    """act(x) elementwise, one of ACTIVATION_FUNCTIONS; any shape."""

    def __init__(self, activation: str, where: str = "") -> None:
        super().__init__()
        self.where = where
        if activation not in ACTIVATION_FUNCTIONS:
            choices = ", ".join(ACTIVATION_FUNCTIONS)
            raise ValueError(
                f"{owner('Activation', where)}: unknown activation {activation!r} (expected one of: {choices})"
            )
        self.activation = activation
        self._function = ACTIVATION_FUNCTIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._function(x)

    def extra_repr(self) -> str:
        return self.activation
