"""AutoInt's interacting layers: multi-head self-attention over the fields of a stack.

Song et al., "AutoInt: Automatic Feature Interaction Learning via
Self-Attentive Neural Networks" (CIKM 2019), section 4.3. Layer l maps a
field stack E [B, N, D_l] to [B, N, H * d'] (D_0 = dim, then H * d'):

    head h:  Q = E W_Q^h,  K = E W_K^h,  V = E W_V^h       (bias-free, d' wide)
             O^h = softmax(Q K^T) V                        (over the fields)
    E' = ReLU(concat_h O^h + E W_Res)                      (residual; without it ReLU(concat_h O^h))

With `residual_projection` False the residual adds E itself (W_Res = I), as
FuxiCTR's AutoInt does when D_l equals H * d'; the stack's width must then be H * d'.

The paper's scores are plain inner products; `scale` divides them by
sqrt(d') as the authors' code and torch's attention do. `layer_norm` applies
a LayerNorm after the ReLU, as the authors' code does. Q, K and V come from
one GEMM over the [B * N, D_l] rows; the attention runs on
F.scaled_dot_product_attention. `in_proj_weight` stacks W_Q, W_K, W_V as
nn.MultiheadAttention's does (xavier-uniform, as there); W_Res is an
nn.Linear's default init.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.modules.blocks.field_stack import check_stack
from runtime.modules.layers.arguments import check_size, owner
from runtime.modules.layers.linear import Linear, linear

__all__ = ["FieldSelfAttention", "InteractingLayer"]


class InteractingLayer(nn.Module):
    """One layer of the formula in the module docstring: [B, N, in_dim] -> [B, N, heads * head_dim]."""

    def __init__(
        self,
        in_dim: int,
        head_dim: int,
        num_heads: int,
        residual: bool,
        scale: bool,
        layer_norm: bool,
        residual_projection: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.scale = scale
        width = num_heads * head_dim
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, in_dim))
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.residual = Linear(in_dim, width, bias=False) if residual and residual_projection else None
        self.identity = residual and not residual_projection
        self.norm = nn.LayerNorm(width) if layer_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, fields, in_dim = x.shape
        rows = x.reshape(batch * fields, in_dim)
        qkv = linear(rows, self.in_proj_weight).view(batch, fields, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, N, d']
        attended = F.scaled_dot_product_attention(q, k, v, scale=None if self.scale else 1.0)
        out = attended.transpose(1, 2).reshape(batch * fields, self.num_heads * self.head_dim)
        if self.residual is not None:
            out = out + self.residual(rows)
        elif self.identity:
            out = out + rows
        out = torch.relu(out).view(batch, fields, -1)
        return self.norm(out) if self.norm is not None else out


class FieldSelfAttention(nn.Module):
    """`num_layers` interacting layers: [B, num_fields, dim] -> [B, num_fields, num_heads * head_dim].

    The paper's setting is 3 layers of 2 heads with head_dim 32, with the residual.
    """

    def __init__(
        self,
        num_fields: int,
        dim: int,
        head_dim: int = 32,
        num_heads: int = 2,
        num_layers: int = 3,
        residual: bool = True,
        scale: bool = False,
        layer_norm: bool = False,
        where: str = "",
        residual_projection: bool = True,
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("FieldSelfAttention", where)
        self.num_fields = check_size(name, "num_fields", num_fields)
        self.dim = check_size(name, "dim", dim)
        self.head_dim = check_size(name, "head_dim", head_dim)
        self.num_heads = check_size(name, "num_heads", num_heads)
        self.num_layers = check_size(name, "num_layers", num_layers)
        for key, value in (("residual", residual), ("scale", scale), ("layer_norm", layer_norm)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}: {key} must be true or false (got {value!r})")
        self.residual, self.scale, self.layer_norm = residual, scale, layer_norm
        self.residual_projection = bool(residual_projection)
        self.out_dim = self.num_heads * self.head_dim
        if residual and not self.residual_projection and self.dim != self.out_dim:
            raise ValueError(
                f"{name}: an identity residual needs dim {self.dim} equal to num_heads * head_dim {self.out_dim}"
            )
        self.interacting = nn.ModuleList(
            InteractingLayer(
                self.dim if i == 0 else self.out_dim,
                head_dim,
                num_heads,
                residual,
                scale,
                layer_norm,
                self.residual_projection,
            )
            for i in range(num_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_stack(owner("FieldSelfAttention", self.where), x, self.num_fields, self.dim)
        for layer in self.interacting:
            x = layer(x)
        return x

    def extra_repr(self) -> str:
        return (
            f"num_fields={self.num_fields}, dim={self.dim}, head_dim={self.head_dim}, "
            f"num_heads={self.num_heads}, num_layers={self.num_layers}, residual={self.residual}, "
            f"scale={self.scale}, layer_norm={self.layer_norm}, residual_projection={self.residual_projection}"
        )
