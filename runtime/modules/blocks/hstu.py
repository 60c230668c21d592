"""HSTU: the Hierarchical Sequential Transduction Unit layer (the `hstu` block).

One layer of generative-recommenders' HSTU (Zhai et al. 2024, "Actions Speak
Louder than Words"), over a padded sequence x [B, L, D] with lengths and a
timestamp per position:

    U, V, Q, K = split(SiLU(LN(x) W_uvqk))               per head: U, V of `linear_dim`,
                                                         Q, K of `attention_dim`
    A[i, j]    = SiLU(Q_i . K_j + rab[i, j]) / N         for j <= i < length, else 0
    out        = (LN(A V) * U) W_o + b_o + x

with LN a LayerNorm without affine parameters (eps 1e-6), N the block's
`max_length` (the paper's sequence length, fixed so a sample's output does
not depend on how far its batch was padded), and the relative attention bias

    rab[i, j]  = w_pos[max_length - 1 + j - i] + w_time[bucket(t_i - t_j)]
    bucket(d)  = clamp(floor(ln(max(|d|, 1)) / 0.301), 0, num_buckets)

generative-recommenders' bias with one change: it buckets t_{i+1} - t_j
(the next position's time, the last position's own), which at a sample's
last real position reads the padding; this block uses the query's own time.
Outputs at padding positions are zero. The LayerNorms, projections and
gating run on the real positions' rows [sum(L), ...] (fbgemm's jagged ops),
as generative-recommenders runs them; only the attention is padded.

`dropout` drops elements of LN(A V) * U before W_o, as generative-recommenders'
`linear_dropout_rate`. The first layer of a stack may also run
generative-recommenders' input preprocessor on x: `scale_input` multiplies
it by sqrt(dim), `positions` adds a learned vector per position (initialised
N(0, 1/dim) truncated at two standard deviations, as theirs), and
`input_dropout` drops elements of the result. Masks are keyed by global
sample (runtime/modules/layers/sequence_dropout.py): N ranks train what one process does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.modules.blocks.pooled import _check_size
from runtime.modules.layers.arguments import check_probability
from runtime.modules.layers.dropout import derive_seed
from runtime.modules.layers.linear import linear
from runtime.modules.layers.sequence_checks import check_sequence
from runtime.modules.layers.sequence_dropout import SequenceDropout
from runtime.sparse.sequence import PaddedLayout

__all__ = ["HSTU", "hstu_layers"]

LN_EPS = 1e-6
BUCKET_DIVISOR = 0.301


def time_buckets(timestamps: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """[B, L] int64 timestamps -> [B, L, L] int64 buckets of t_i - t_j.

    The L x L work is most of an HSTU layer's forward on a CPU, so it runs in
    place, and on int32 differences (half the bytes) when every time lies within
    2**30 units of its sample's first (34 years of seconds). Either way the
    difference is the exact integer and its log a float32 one, so the buckets
    are the same.
    """
    relative = timestamps - timestamps[:, :1]
    if not relative.is_floating_point() and (relative.numel() == 0 or relative.abs().amax() < 2**30):
        relative = relative.to(torch.int32)  # |t_i - t_j| < 2**31
    delta = (relative.unsqueeze(2) - relative.unsqueeze(1)).abs_().clamp_min_(1)
    logs = delta.to(torch.float32).log_().div_(BUCKET_DIVISOR)
    return logs.floor_().clamp_(0, num_buckets).long()


class HSTU(nn.Module):
    """(x (B, L, dim), lengths (B,), timestamps (B, L)) -> (B, L, dim); see the module docstring."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention_dim: int,
        linear_dim: int,
        max_length: int,
        num_buckets: int = 128,
        dropout: float = 0.0,
        scale_input: bool = False,
        positions: bool = False,
        input_dropout: float = 0.0,
        seed: int = 0,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.dim = _check_size("HSTU", "dim", dim)
        self.num_heads = _check_size("HSTU", "num_heads", num_heads)
        self.attention_dim = _check_size("HSTU", "attention_dim", attention_dim)
        self.linear_dim = _check_size("HSTU", "linear_dim", linear_dim)
        self.max_length = _check_size("HSTU", "max_length", max_length)
        self.num_buckets = _check_size("HSTU", "num_buckets", num_buckets)
        width = num_heads * (2 * linear_dim + 2 * attention_dim)
        # generative-recommenders' initialisation: N(0, 0.02) projections, xavier output.
        self.uvqk = nn.Parameter(torch.empty(width, dim).normal_(0.0, 0.02))
        self.output = nn.Linear(num_heads * linear_dim, dim)
        nn.init.xavier_uniform_(self.output.weight)
        self.position_bias = nn.Parameter(torch.empty(2 * max_length - 1).normal_(0.0, 0.02))
        self.time_bias = nn.Parameter(torch.empty(num_buckets + 1).normal_(0.0, 0.02))
        self.dropout = check_probability("HSTU", "dropout", dropout)
        self.input_dropout = check_probability("HSTU", "input_dropout", input_dropout)
        self.scale_input = bool(scale_input)
        self.positions = None
        if positions:
            std = dim**-0.5
            self.positions = nn.Parameter(
                nn.init.trunc_normal_(torch.empty(max_length, dim), 0.0, std, -2 * std, 2 * std)
            )
        self.drop = SequenceDropout(seed, process_group, where="HSTU")

    def relative_bias(self, timestamps: torch.Tensor) -> torch.Tensor:
        """rab [B, L, L] for timestamps [B, L]."""
        length = timestamps.shape[1]
        steps = torch.arange(length, device=timestamps.device)
        position = self.position_bias[self.max_length - 1 + steps.unsqueeze(0) - steps.unsqueeze(1)]
        return position + self.time_bias[time_buckets(timestamps, self.num_buckets)]

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, timestamps: torch.Tensor) -> torch.Tensor:
        check_sequence("HSTU", x, lengths, self.dim)
        batch, length, dim = x.shape
        if length > self.max_length:
            raise ValueError(f"HSTU: a padded length of {length} exceeds max_length {self.max_length}")
        if timestamps.shape != (batch, length):
            raise ValueError(f"HSTU: expected timestamps of shape ({batch}, {length}), got {tuple(timestamps.shape)}")
        heads, a, u_dim = self.num_heads, self.attention_dim, self.linear_dim
        if self.scale_input:
            x = x * dim**0.5
        if self.positions is not None:
            x = x + self.positions[:length]
        draw = self.drop.draw(batch, x.device) if self.dropout or self.input_dropout else None
        if draw is not None:
            x = draw.padded(x, self.input_dropout, 0)
        # Position-wise work on the real rows; only the attention is padded.
        layout = PaddedLayout(lengths, length)
        rows = layout.rows(x)
        uvqk = F.silu(linear(F.layer_norm(rows, (dim,), eps=LN_EPS), self.uvqk))
        u, vqk = uvqk.split([heads * u_dim, uvqk.shape[1] - heads * u_dim], dim=1)
        v, q, k = layout.padded(vqk).split([heads * u_dim, heads * a, heads * a], dim=2)
        q = q.reshape(batch, length, heads, a).transpose(1, 2)
        k = k.reshape(batch, length, heads, a).transpose(1, 2)
        v = v.reshape(batch, length, heads, u_dim).transpose(1, 2)
        # Padding takes its sample's first time: its buckets are masked out below either way, and real
        # times alone decide whether the differences fit int32 (see time_buckets).
        real_times = torch.where(layout.mask, timestamps, timestamps[:, :1])
        scores = q @ k.transpose(2, 3) + self.relative_bias(real_times).unsqueeze(1)
        allowed = layout.mask.unsqueeze(1) & layout.mask.unsqueeze(2)
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        weights = F.silu(scores) * (allowed.unsqueeze(1).to(x.dtype) / self.max_length)
        attended = layout.rows((weights @ v).transpose(1, 2).reshape(batch, length, heads * u_dim))
        gated = F.layer_norm(attended, (heads * u_dim,), eps=LN_EPS) * u
        if draw is not None:
            gated = draw.rows(gated, layout, self.dropout, 1)
        out = linear(gated, self.output.weight, self.output.bias) + rows
        return layout.padded(out)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, attention_dim={self.attention_dim}, "
            f"linear_dim={self.linear_dim}, max_length={self.max_length}, "
            f"num_buckets={self.num_buckets}, dropout={self.dropout}, scale_input={self.scale_input}, "
            f"positions={self.positions is not None}, input_dropout={self.input_dropout}"
        )


def hstu_layers(
    num_layers: int,
    scale_input: bool = False,
    positions: bool = False,
    input_dropout: float = 0.0,
    seed: int = 0,
    **layer: Any,
) -> nn.ModuleList:
    """`num_layers` HSTU layers of the same sizes (`layer`: HSTU's arguments), run in turn by the graph.

    The first layer runs the input preprocessor (`scale_input`, `positions`, `input_dropout`); layer i's
    dropout masks are keyed by a seed derived from `seed` and i.
    """
    _check_size("hstu_layers", "num_layers", num_layers)
    first = {"scale_input": scale_input, "positions": positions, "input_dropout": input_dropout}
    return nn.ModuleList(
        HSTU(**layer, **(first if i == 0 else {}), seed=derive_seed(seed, i)) for i in range(num_layers)
    )
