"""xDeepFM's compressed interaction network (CIN) over a field stack.

Lian et al., "xDeepFM: Combining Explicit and Implicit Feature Interactions
for Recommender Systems" (KDD 2018), section 3.2. With X^0 the input stack
[B, m, D] and X^{k-1} [B, H_{k-1}, D] (H_0 = m), layer k computes H_k
feature maps

    X^k_h = act( sum_{j < m, i < H_{k-1}} W^k[h, j * H_{k-1} + i] (X^0_j ∘ X^{k-1}_i) + b^k_h )

(∘ the elementwise product over D; the column order j * H_{k-1} + i is the
one of the authors' code, so their filters load as they are). Each layer's
output maps are sum-pooled over D and concatenated into the block's output.
With `split_half` (the authors' default), every layer but the last sends its
first H_k / 2 maps to the next layer and its other H_k / 2 to the output, so
the output width is sum_{k<L} H_k / 2 + H_L; without it, every map goes both
ways and the width is sum_k H_k. The authors' configuration uses no bias and
the identity activation, the defaults here. Filters are xavier-uniform.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from runtime.modules.blocks.field_stack import check_stack
from runtime.modules.blocks.pooled import _activation
from runtime.modules.layers.arguments import check_layers, check_size, owner

__all__ = ["CIN"]


class CIN(nn.Module):
    """[B, num_fields, dim] -> [B, out_features], the sum-pooled feature maps of every layer."""

    def __init__(
        self,
        num_fields: int,
        dim: int,
        layer_sizes: Sequence[int],
        split_half: bool = True,
        activation: str | None = None,
        bias: bool = False,
        where: str = "",
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("CIN", where)
        self.num_fields = check_size(name, "num_fields", num_fields)
        self.dim = check_size(name, "dim", dim)
        self.layer_sizes = check_layers(name, "layer_sizes", layer_sizes)
        for key, value in (("split_half", split_half), ("bias", bias)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}: {key} must be true or false (got {value!r})")
        if split_half:
            for k, size in enumerate(self.layer_sizes[:-1]):
                if size % 2:
                    raise ValueError(f"{name}: layer_sizes[{k}] must be even with split_half (got {size})")
        self.split_half = split_half
        self.activation = "none" if activation is None else activation
        self._act = _activation(name, "activation", activation)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList() if bias else None
        hidden = self.num_fields
        self.out_features = 0
        for k, size in enumerate(self.layer_sizes):
            weight = nn.Parameter(torch.empty(size, self.num_fields * hidden))
            nn.init.xavier_uniform_(weight)
            self.weights.append(weight)
            if self.biases is not None:
                self.biases.append(nn.Parameter(torch.zeros(size)))
            last = k == len(self.layer_sizes) - 1
            hidden = size // 2 if split_half and not last else size
            self.out_features += hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_stack(owner("CIN", self.where), x, self.num_fields, self.dim)
        batch = x.shape[0]
        hidden, pooled = x, []
        for k, weight in enumerate(self.weights):
            # [B, m, H, D] products of every (X^0_j, X^{k-1}_i), as [B, m * H, D] columns j * H + i.
            z = (x.unsqueeze(2) * hidden.unsqueeze(1)).reshape(batch, -1, self.dim)
            maps = torch.matmul(weight, z)  # [B, H_k, D]
            if self.biases is not None:
                maps = maps + self.biases[k].unsqueeze(1)
            if self._act is not None:
                maps = self._act(maps)
            if self.split_half and k < len(self.weights) - 1:
                hidden, direct = maps.split(maps.shape[1] // 2, dim=1)
            else:
                hidden = direct = maps
            pooled.append(direct.sum(dim=2))
        return torch.cat(pooled, dim=1)

    def extra_repr(self) -> str:
        return (
            f"num_fields={self.num_fields}, dim={self.dim}, layer_sizes={self.layer_sizes}, "
            f"split_half={self.split_half}, activation={self.activation}, out_features={self.out_features}"
        )
