"""MaskNet's instance-guided masks: `MaskBlock`, and `MaskNet` in its serial and parallel forms.

Wang et al., "MaskNet: Introducing Feature-Wise Multiplication to CTR
Ranking Models by Instance-Guided Mask" (DLP-KDD 2021), section 3. With
V_emb the flattened field stack [B, N * D] and V the tensor to mask:

    mask(V_emb) = W_2 ReLU(W_1 V_emb + b_1) + b_2     (aggregation layer of
                  width round(reduction_ratio * |V|), projection back to |V|)
    MaskBlock(V_emb, V) = act(LN(W_i (mask(V_emb) ∘ V)))   (LN-hidden; W_i bias-free
                  under the LayerNorm, with a bias without it)

MaskNet first normalises each field of the stack on its own (LN_EMB: one
LayerNorm per field), then, serial: the first block masks LN_EMB(V_emb) and
each next block masks the previous block's output, every mask computed from
the raw V_emb; parallel: every block masks LN_EMB(V_emb) and their outputs are
concatenated. With `emb_norm_scope` "whole", LN_EMB is one LayerNorm over
the flattened [N * D] input instead, as TorchEasyRec's MaskNetModule has it.
An optional MLP (`layers`, ReLU after each) follows, before the model's
output layer. Linears have nn.Linear's init.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runtime.modules.blocks.field_stack import check_stack
from runtime.modules.blocks.pooled import MLP, _activation
from runtime.modules.layers.arguments import check_layers, check_size, owner
from runtime.modules.layers.linear import Linear

__all__ = ["EMB_NORM_SCOPES", "MASKNET_MODES", "MaskBlock", "MaskNet"]

MASKNET_MODES = ("parallel", "serial")
EMB_NORM_SCOPES = ("field", "whole")


def _check_ratio(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: reduction_ratio must be a number > 0 (got {value!r})")
    return float(value)


def _check_flag(name: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: {key} must be true or false (got {value!r})")
    return value


class MaskBlock(nn.Module):
    """(V_emb [B, mask_features], V [B, in_features]) -> [B, out_features], the formula above."""

    def __init__(
        self,
        mask_features: int,
        in_features: int,
        out_features: int,
        reduction_ratio: float = 1.0,
        layer_norm: bool = True,
        activation: str = "relu",
        where: str = "",
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("MaskBlock", where)
        self.mask_features = check_size(name, "mask_features", mask_features)
        self.in_features = check_size(name, "in_features", in_features)
        self.out_features = check_size(name, "out_features", out_features)
        self.reduction_ratio = _check_ratio(name, reduction_ratio)
        aggregation = round(self.reduction_ratio * self.in_features)
        if aggregation < 1:
            raise ValueError(
                f"{name}: reduction_ratio {reduction_ratio!r} times in_features {in_features} "
                f"leaves an aggregation layer of width {aggregation}"
            )
        self.layer_norm = _check_flag(name, "layer_norm", layer_norm)
        self.activation = activation
        self._act = _activation(name, "activation", activation)
        self.aggregation = Linear(self.mask_features, aggregation)
        self.projection = Linear(aggregation, self.in_features)
        self.hidden = Linear(self.in_features, self.out_features, bias=not layer_norm)
        self.norm = nn.LayerNorm(self.out_features) if layer_norm else None

    def forward(self, v_emb: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        name = owner("MaskBlock", self.where)
        if v_emb.dim() != 2 or v_emb.shape[1] != self.mask_features or v.shape != (v_emb.shape[0], self.in_features):
            raise ValueError(
                f"{name}: expected inputs of shapes (B, {self.mask_features}) and (B, {self.in_features}), "
                f"got {tuple(v_emb.shape)} and {tuple(v.shape)}"
            )
        mask = self.projection(torch.relu(self.aggregation(v_emb)))
        out = self.hidden(mask * v)
        if self.norm is not None:
            out = self.norm(out)
        return self._act(out) if self._act is not None else out

    def extra_repr(self) -> str:
        return (
            f"mask_features={self.mask_features}, in_features={self.in_features}, "
            f"out_features={self.out_features}, reduction_ratio={self.reduction_ratio}, "
            f"layer_norm={self.layer_norm}, activation={self.activation}"
        )


class MaskNet(nn.Module):
    """[B, num_fields, dim] -> [B, out_features]: serial or parallel MaskBlocks, then an optional MLP.

    `block_sizes` are the blocks' output widths. Serial: out_features is the
    last block's width (or the MLP's); parallel: their sum (or the MLP's).
    """

    def __init__(
        self,
        num_fields: int,
        dim: int,
        mode: str,
        block_sizes: Sequence[int],
        reduction_ratio: float = 1.0,
        emb_layer_norm: bool = True,
        layer_norm: bool = True,
        layers: Sequence[int] = (),
        activation: str = "relu",
        where: str = "",
        emb_norm_scope: str = "field",
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("MaskNet", where)
        if emb_norm_scope not in EMB_NORM_SCOPES:
            raise ValueError(
                f"{name}: unknown emb_norm_scope {emb_norm_scope!r} (expected one of: {', '.join(EMB_NORM_SCOPES)})"
            )
        self.emb_norm_scope = emb_norm_scope
        self.num_fields = check_size(name, "num_fields", num_fields)
        self.dim = check_size(name, "dim", dim)
        if mode not in MASKNET_MODES:
            raise ValueError(f"{name}: unknown mode {mode!r} (expected one of: {', '.join(MASKNET_MODES)})")
        self.mode = mode
        self.block_sizes = check_layers(name, "block_sizes", block_sizes)
        self.emb_layer_norm = _check_flag(name, "emb_layer_norm", emb_layer_norm)
        width = self.num_fields * self.dim
        if mode == "serial":
            ins = [width, *self.block_sizes[:-1]]
            blocks_out = self.block_sizes[-1]
        else:
            ins = [width] * len(self.block_sizes)
            blocks_out = sum(self.block_sizes)
        self.blocks = nn.ModuleList(
            MaskBlock(width, a, b, reduction_ratio, layer_norm, activation, where)
            for a, b in zip(ins, self.block_sizes)
        )
        if self.emb_layer_norm:
            # "field": one LayerNorm per field, a shared normalisation, a gain and bias per field;
            # "whole": one LayerNorm over the flattened [N * D] input (TorchEasyRec's MaskNetModule).
            self.emb_norm_weight = nn.Parameter(torch.ones(self.num_fields, self.dim))
            self.emb_norm_bias = nn.Parameter(torch.zeros(self.num_fields, self.dim))
        empty = isinstance(layers, Sequence) and not isinstance(layers, (str, bytes)) and len(layers) == 0
        self.layers = [] if empty else check_layers(name, "layers", layers)
        self.mlp = MLP(blocks_out, self.layers, activation, activation, where) if self.layers else None
        self.out_features = self.mlp.out_features if self.mlp is not None else blocks_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_stack(owner("MaskNet", self.where), x, self.num_fields, self.dim)
        batch = x.shape[0]
        v_emb = x.reshape(batch, -1)
        if self.emb_layer_norm and self.emb_norm_scope == "whole":
            hidden = F.layer_norm(v_emb, (v_emb.shape[1],), self.emb_norm_weight.view(-1), self.emb_norm_bias.view(-1))
        elif self.emb_layer_norm:
            normed = F.layer_norm(x, (self.dim,)) * self.emb_norm_weight + self.emb_norm_bias
            hidden = normed.reshape(batch, -1)
        else:
            hidden = v_emb
        if self.mode == "serial":
            for block in self.blocks:
                hidden = block(v_emb, hidden)
            out = hidden
        else:
            out = torch.cat([block(v_emb, hidden) for block in self.blocks], dim=1)
        return self.mlp(out) if self.mlp is not None else out

    def extra_repr(self) -> str:
        return (
            f"num_fields={self.num_fields}, dim={self.dim}, mode={self.mode}, "
            f"block_sizes={self.block_sizes}, out_features={self.out_features}, emb_norm_scope={self.emb_norm_scope}"
        )
