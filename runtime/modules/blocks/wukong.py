"""Wukong's interaction layers over a field stack: a factorization-machine block and a linear compress block.

Zhang et al., "Wukong: Towards a Scaling Law for Large-Scale Recommendation"
(ICML 2024), section 3. A layer maps X [B, n, d] to [B, n_F + n_L, d]:

    FMB(X) = MLP(LN(flatten(X (X^T Y))))  reshaped to [B, n_F, d]
             (Y [n, k] a learned projection: the rank-k form of the FM's X X^T)
    LCB(X) = W_L X                         (W_L [n_L, n]: recombines the fields)
    out    = LN_d(concat(FMB(X), LCB(X)) + R X)

where the MLP has ReLU hidden layers and a linear output of n_F * d, LN
normalises the n * k interactions, LN_d each output field over d, and R is the
identity when n = n_F + n_L, else a learned [n_F + n_L, n] projection, as in
the public reference implementation of the paper. Y, W_L and R are
xavier-uniform; the MLP has nn.Linear's init. `Wukong` stacks layers with
the same n_F, n_L, k and MLP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runtime.modules.blocks.field_stack import check_stack
from runtime.modules.blocks.pooled import MLP, _check_norm
from runtime.modules.layers.arguments import check_probability, check_size, owner
from runtime.modules.layers.dropout import derive_seed

__all__ = ["Wukong", "WukongLayer"]


def _xavier(*shape: int) -> nn.Parameter:
    weight = nn.Parameter(torch.empty(*shape))
    nn.init.xavier_uniform_(weight)
    return weight


class WukongLayer(nn.Module):
    """One layer of the formula in the module docstring: [B, num_fields, dim] -> [B, num_fmb + num_lcb, dim]."""

    def __init__(
        self,
        num_fields: int,
        dim: int,
        num_fmb: int,
        num_lcb: int,
        rank: int,
        fmb_layers: Sequence[int],
        activation: str,
        mlp_options: dict[str, Any],
        where: str,
    ) -> None:
        super().__init__()
        self.num_fields, self.dim, self.num_fmb, self.rank = num_fields, dim, num_fmb, rank
        self.out_fields = num_fmb + num_lcb
        self.fmb_projection = _xavier(num_fields, rank)
        self.fmb_norm = nn.LayerNorm(num_fields * rank)
        self.fmb_mlp = MLP(num_fields * rank, [*fmb_layers, num_fmb * dim], activation, None, where, **mlp_options)
        self.lcb_weight = _xavier(num_lcb, num_fields)
        self.residual_projection = _xavier(self.out_fields, num_fields) if self.out_fields != num_fields else None
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        interactions = torch.bmm(x, torch.matmul(x.transpose(1, 2), self.fmb_projection))  # [B, n, k]
        fmb = self.fmb_mlp(self.fmb_norm(interactions.reshape(batch, -1))).view(batch, self.num_fmb, self.dim)
        lcb = torch.matmul(self.lcb_weight, x)
        shortcut = x if self.residual_projection is None else torch.matmul(self.residual_projection, x)
        return self.norm(torch.cat([fmb, lcb], dim=1) + shortcut)


class Wukong(nn.Module):
    """`num_layers` Wukong layers: [B, num_fields, dim] -> [B, num_fmb + num_lcb, dim].

    `mlp_norm` and `mlp_dropout` (with `process_group`) go to the FMB's MLP
    (see runtime.modules.blocks.pooled.MLP), on its hidden layers; layer i's
    dropout seed is derive_seed(seed, i).
    """

    def __init__(
        self,
        num_fields: int,
        dim: int,
        num_layers: int,
        num_fmb: int,
        num_lcb: int,
        rank: int,
        fmb_layers: Sequence[int] = (),
        activation: str = "relu",
        mlp_norm: str | None = None,
        mlp_dropout: float = 0.0,
        seed: int = 0,
        process_group: dist.ProcessGroup | None = None,
        where: str = "",
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("Wukong", where)
        self.num_fields = check_size(name, "num_fields", num_fields)
        self.dim = check_size(name, "dim", dim)
        self.num_layers = check_size(name, "num_layers", num_layers)
        self.num_fmb = check_size(name, "num_fmb", num_fmb)
        self.num_lcb = check_size(name, "num_lcb", num_lcb)
        self.rank = check_size(name, "rank", rank)
        if isinstance(fmb_layers, (str, bytes)) or not isinstance(fmb_layers, Sequence):
            raise ValueError(f"{name}: fmb_layers must be a list of sizes (got {fmb_layers!r})")
        self.fmb_layers = [check_size(name, f"fmb_layers[{i}]", size) for i, size in enumerate(fmb_layers)]
        self.out_fields = self.num_fmb + self.num_lcb
        mlp_norm = _check_norm(name, mlp_norm, "mlp_norm")
        mlp_dropout = check_probability(name, "mlp_dropout", mlp_dropout)
        mlp_options: dict[str, Any] = {}
        if mlp_norm != "none" or mlp_dropout > 0:
            if not self.fmb_layers:
                raise ValueError(f"{name}: mlp_norm and mlp_dropout need hidden fmb_layers (got [])")
            mlp_options = {"norm": mlp_norm, "dropout": mlp_dropout, "process_group": process_group}
        self.layers = nn.ModuleList(
            WukongLayer(
                self.num_fields if i == 0 else self.out_fields,
                self.dim,
                self.num_fmb,
                self.num_lcb,
                self.rank,
                self.fmb_layers,
                activation,
                {**mlp_options, "seed": derive_seed(seed, i)} if mlp_options else {},
                where,
            )
            for i in range(num_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_stack(owner("Wukong", self.where), x, self.num_fields, self.dim)
        for layer in self.layers:
            x = layer(x)
        return x

    def extra_repr(self) -> str:
        return (
            f"num_fields={self.num_fields}, dim={self.dim}, num_layers={self.num_layers}, "
            f"num_fmb={self.num_fmb}, num_lcb={self.num_lcb}, rank={self.rank}, fmb_layers={self.fmb_layers}"
        )
