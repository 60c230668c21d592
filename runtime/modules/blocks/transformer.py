"""Transformer: a stack of encoder layers over padded sequences (the `transformer` block).

Each layer is torch.nn.TransformerEncoderLayer's math (multi-head
self-attention and a two-layer feed-forward, each with a residual and a
LayerNorm, after it (post-norm, the default) or before it (`norm_first`)),
with the padding masked from the lengths, optionally causal, and learned
positions (N(0, 1), as nn.Embedding) added to the input when `max_length` is
given. Parameters are named as torch's layer names them, so its weights load
unchanged. With `position_dim` P the learned positions [max_length, P] are
concatenated to the input instead of added, as BST does: the layers and the
output are dim + P wide. `sasrec` arranges a layer as generative-recommenders' SASRec does
(LayerNorms of eps 1e-8, the query normalised but not the keys and values):

    x' = LN(LN(x) + MHA(LN(x), x, x));   out = x' + FFN(x')

Options of generative-recommenders' input preprocessor: `scale_input`
multiplies the input by sqrt(dim) before the positions are added, and
`input_dropout` drops elements of the result. `dropout` is torch's layer's:
on the attention weights, the attention output (not under `sasrec`, as
generative-recommenders), the feed-forward's hidden activations and its
output. Every mask is keyed by global sample (runtime/modules/layers/sequence_dropout.py),
so N ranks train what one process trains. `norm_affine` False gives the
LayerNorms no scale and shift (generative-recommenders' F.layer_norm).

Only the attention needs the padded form: everything else (projections,
feed-forward, norms, residuals) runs on the rows of the real positions
[sum(L), dim], converted with fbgemm's jagged ops, which on seq-bench's
histories (1-50 items, padded to 51) halves the GEMM work that torch's
layer spends on padding. The GEMMs run on `runtime.modules.layers.linear` (oneDNN
on the CPU), the attention on `F.scaled_dot_product_attention` (under bf16
training in the precision measured faster: runtime/modules/layers/padded_attention.py).

Output positions at or after a sample's length are zero. A sample with no
positions attends to its first (padding) position instead of to nothing, so
no NaN appears, and its output is zero like all padding.

`output="first"` or `"last"` returns only that position of each sequence
[B, dim] (zeros for an empty one): what the full output followed by
`SequencePool(mode="first"|"last")` gives, up to float rounding, at a
fraction of the work. The last layer then has one query per sample, and its
keys and values are never formed: with q_h the query of head h, the scores
x_t . (W_k,h^T q_h) and the weighted sum (sum_t p_t x_t) W_v,h^T + b_v,h
need only [B, L, dim] x [B, dim, heads] products over the padded input, no
projection of the B x L positions (the key bias adds the same score to every
position, which softmax ignores). A BST-style model reads the target's
position alone; at seq-bench's shapes this cuts the layer's forward and
backward about 5x. The compiler sets it when a `sequence_pool` of that mode
is the transformer's only reader.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.modules.blocks.pooled import _check_size
from runtime.modules.layers.arguments import check_probability
from runtime.modules.layers.linear import Linear, linear
from runtime.modules.layers.one_query_attention import one_query_attention
from runtime.modules.layers.padded_attention import padded_attention
from runtime.modules.layers.sequence_checks import check_sequence
from runtime.modules.layers.sequence_dropout import Draw, SequenceDropout
from runtime.sparse.sequence import PaddedLayout

__all__ = ["OUTPUTS", "Transformer", "TransformerLayer"]

FFN_ACTIVATIONS = ("relu", "gelu", "leaky_relu")
SASREC_EPS = 1e-8
# Dropout streams: 0 the input, then four per layer (attention weights, attention output, FFN hidden, FFN output).
STREAMS_PER_LAYER = 4
OUTPUTS = ("sequence", "first", "last")


def _allowed(layout: PaddedLayout, causal: bool) -> torch.Tensor:
    """[B, 1, L or 1, L] bool: the keys each query may attend to."""
    length, device = layout.length, layout.lengths.device
    # An empty sequence attends to its first position: a row with no allowed key is NaN.
    keys = layout.mask | (torch.arange(length, device=device) == 0)
    allowed = keys.view(-1, 1, 1, length)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return allowed


class _SelfAttention(nn.Module):
    """Multi-head self-attention with nn.MultiheadAttention's parameter names."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        rows: torch.Tensor,
        layout: PaddedLayout,
        allowed: torch.Tensor,
        queries: torch.Tensor | None = None,
        draw: Draw | None = None,
        p: float = 0.0,
        stream: int = 0,
    ) -> torch.Tensor:
        """Attention of `queries` (default: `rows`) over `rows`, both [sum(L), dim]; dropout p on the weights."""
        heads, dim = self.num_heads, rows.shape[1]
        if queries is None:
            qkv = layout.padded(linear(rows, self.in_proj_weight, self.in_proj_bias))
        else:
            q = linear(queries, self.in_proj_weight[:dim], self.in_proj_bias[:dim])
            kv = linear(rows, self.in_proj_weight[dim:], self.in_proj_bias[dim:])
            qkv = layout.padded(torch.cat([q, kv], dim=1))
        batch, length = qkv.shape[:2]
        q, k, v = qkv.view(batch, length, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        if draw is None or p == 0.0:
            attended = padded_attention(q, k, v, allowed)
        else:
            scores = (q @ k.transpose(2, 3)) * (dim // heads) ** -0.5
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            attended = draw.padded(weights, p, stream) @ v
        attended = layout.rows(attended.transpose(1, 2).reshape(batch, length, dim))
        return linear(attended, self.out_proj.weight, self.out_proj.bias)

    def attend_from(self, x: torch.Tensor, own: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The attention output [B, dim] of one query per sample over the padded `x` [B, L, dim].

        `own` [B, dim] is the query position's row of `x`; sample b attends to its positions
        0 .. counts[b]-1.
        """
        heads, (batch, _, dim) = self.num_heads, x.shape
        head_dim = dim // heads
        _, weight_k, weight_v = self.in_proj_weight.view(3, heads, head_dim, dim).unbind(0)
        q = linear(own, self.in_proj_weight[:dim], self.in_proj_bias[:dim]).view(batch, heads, head_dim)
        q_in_x = torch.einsum("bhe,hed->bhd", q, weight_k) * head_dim**-0.5  # [B, heads, dim]
        weighted = one_query_attention(x, q_in_x, counts)  # [B, heads, dim]
        values = torch.einsum("bhd,hed->bhe", weighted, weight_v) + self.in_proj_bias[2 * dim :].view(heads, head_dim)
        return linear(values.reshape(batch, dim), self.out_proj.weight, self.out_proj.bias)


class TransformerLayer(nn.Module):
    """One encoder layer over the rows of the real positions (see the module docstring).

    `norm_first` and `sasrec` choose the arrangement (post-norm when neither);
    `stream` is the first of the layer's STREAMS_PER_LAYER dropout streams.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        norm_first: bool,
        activation: str,
        sasrec: bool = False,
        norm_affine: bool = True,
        dropout: float = 0.0,
        stream: int = 1,
    ) -> None:
        super().__init__()
        self.norm_first, self.sasrec = norm_first, sasrec
        self.activation, self.dropout, self.stream = activation, dropout, stream
        self.self_attn = _SelfAttention(dim, num_heads)
        self.linear1 = Linear(dim, ffn_dim)
        self.linear2 = Linear(ffn_dim, dim)
        eps = SASREC_EPS if sasrec else 1e-5
        self.norm1 = nn.LayerNorm(dim, eps=eps, elementwise_affine=norm_affine)
        self.norm2 = nn.LayerNorm(dim, eps=eps, elementwise_affine=norm_affine)

    def _feed_forward(self, rows: torch.Tensor, drop: _Drop) -> torch.Tensor:
        relu = self.activation == "relu"
        hidden = linear(rows, self.linear1.weight, self.linear1.bias, relu=relu)
        if self.activation == "gelu":
            hidden = F.gelu(hidden)
        elif self.activation == "leaky_relu":
            hidden = F.leaky_relu(hidden)
        hidden = drop(hidden, 2)
        return drop(linear(hidden, self.linear2.weight, self.linear2.bias), 3)

    def forward(
        self, rows: torch.Tensor, layout: PaddedLayout, allowed: torch.Tensor, draw: Draw | None = None
    ) -> torch.Tensor:
        """The real positions' rows [sum(L), dim] in and out; `draw` the step's dropout masks (None: none)."""
        drop = _Drop(draw, layout, self.dropout, self.stream)
        if self.sasrec:
            query = self.norm1(rows)
            rows = self.norm2(query + self.self_attn(rows, layout, allowed, query, draw, self.dropout, self.stream))
            return rows + self._feed_forward(rows, drop)
        if self.norm_first:
            normed = self.norm1(rows)
            rows = rows + drop(self.self_attn(normed, layout, allowed, None, draw, self.dropout, self.stream), 1)
            return rows + self._feed_forward(self.norm2(rows), drop)
        rows = self.norm1(rows + drop(self.self_attn(rows, layout, allowed, None, draw, self.dropout, self.stream), 1))
        return self.norm2(rows + self._feed_forward(rows, drop))

    def forward_at(self, x: torch.Tensor, position: torch.Tensor | None, counts: torch.Tensor) -> torch.Tensor:
        """`forward`'s output (no dropout) at one position per sample of the padded `x` [B, L, dim] -> [B, dim].

        `position` [B] holds each sample's position (None: the first for all). The sample attends to its positions 0 .. counts[b]-1.
        """
        own = x[:, 0] if position is None else x[torch.arange(x.shape[0], device=x.device), position]
        drop = _Drop(None, None, 0.0, 0)
        if self.sasrec:
            query = self.norm1(own)
            own = self.norm2(query + self.self_attn.attend_from(x, query, counts))
            return own + self._feed_forward(own, drop)
        if self.norm_first:
            # LayerNorm is row-wise: the query's row of norm1(x) is norm1 of its row.
            own = own + self.self_attn.attend_from(self.norm1(x), self.norm1(own), counts)
            return own + self._feed_forward(self.norm2(own), drop)
        own = self.norm1(own + self.self_attn.attend_from(x, own, counts))
        return self.norm2(own + self._feed_forward(own, drop))


class _Drop:
    """A layer's dropout on rows at its stream + offset, or nothing without a draw (eval, or p 0)."""

    def __init__(self, draw: Draw | None, layout: PaddedLayout | None, p: float, stream: int) -> None:
        self.draw, self.layout, self.p, self.stream = draw, layout, p, stream

    def __call__(self, rows: torch.Tensor, offset: int) -> torch.Tensor:
        if self.draw is None or self.layout is None:
            return rows
        return self.draw.rows(rows, self.layout, self.p, self.stream + offset)


class Transformer(nn.Module):
    """Encoder layers over a padded sequence: (B, L, dim), lengths (B,) -> (B, L, dim).

    `max_length` > 0 adds learned positions (and bounds L); 0 adds none.
    `output` "first" or "last" returns that position only, (B, dim); see the
    module docstring. `seed` keys the dropout masks and `process_group` gives
    the rank's first global sample (see runtime/modules/layers/sequence_dropout.py).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        num_layers: int = 1,
        norm_first: bool = False,
        causal: bool = False,
        max_length: int = 0,
        activation: str = "relu",
        output: str = "sequence",
        sasrec: bool = False,
        norm_affine: bool = True,
        scale_input: bool = False,
        dropout: float = 0.0,
        input_dropout: float = 0.0,
        seed: int = 0,
        process_group: dist.ProcessGroup | None = None,
        position_dim: int = 0,
    ) -> None:
        super().__init__()
        self.dim = _check_size("Transformer", "dim", dim)
        self.position_dim = _check_size("Transformer", "position_dim", position_dim, minimum=0)
        if position_dim and not max_length:
            raise ValueError("Transformer: position_dim concatenates learned positions, which need max_length")
        # The layers' width: the input's, and the concatenated positions' (BST).
        self.width = width = dim + position_dim
        self.num_heads = _check_size("Transformer", "num_heads", num_heads)
        self.ffn_dim = _check_size("Transformer", "ffn_dim", ffn_dim)
        self.num_layers = _check_size("Transformer", "num_layers", num_layers)
        self.max_length = _check_size("Transformer", "max_length", max_length, minimum=0)
        self.dropout = check_probability("Transformer", "dropout", dropout)
        self.input_dropout = check_probability("Transformer", "input_dropout", input_dropout)
        if width % num_heads:
            what = f"dim {dim}" if not position_dim else f"dim {dim} + position_dim {position_dim}"
            raise ValueError(f"Transformer: {what} is not divisible by num_heads {num_heads}")
        if activation not in FFN_ACTIVATIONS:
            raise ValueError(
                f"Transformer: unknown activation {activation!r} (expected one of: {', '.join(FFN_ACTIVATIONS)})"
            )
        if output not in OUTPUTS:
            raise ValueError(f"Transformer: unknown output {output!r} (expected one of: {', '.join(OUTPUTS)})")
        if sasrec and norm_first:
            raise ValueError("Transformer: sasrec is its own arrangement of the norms; norm_first must be False")
        self.norm_first, self.causal, self.activation = bool(norm_first), bool(causal), activation
        self.output, self.sasrec, self.norm_affine = output, bool(sasrec), bool(norm_affine)
        self.scale_input = bool(scale_input)
        self.positions = nn.Parameter(torch.randn(max_length, position_dim or dim)) if max_length else None
        self.layers = nn.ModuleList(
            TransformerLayer(
                width,
                num_heads,
                ffn_dim,
                self.norm_first,
                activation,
                self.sasrec,
                self.norm_affine,
                self.dropout,
                stream=1 + STREAMS_PER_LAYER * i,
            )
            for i in range(num_layers)
        )
        self.drop = SequenceDropout(seed, process_group, where="Transformer")

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        check_sequence("Transformer", x, lengths, self.dim)
        length = x.shape[1]
        if self.scale_input:
            x = x * self.dim**0.5
        if self.positions is not None:
            if length > self.max_length:
                raise ValueError(f"Transformer: a padded length of {length} exceeds max_length {self.max_length}")
            if self.position_dim:
                x = torch.cat([x, self.positions[:length].expand(x.shape[0], -1, -1)], dim=2)
            else:
                x = x + self.positions[:length]
        draw = self.drop.draw(x.shape[0], x.device) if self.dropout or self.input_dropout else None
        if draw is not None:
            x = draw.padded(x, self.input_dropout, 0)
        # The one-position path has no dropout inside the attention: with dropout the last layer runs in full.
        one_position = self.output != "sequence" and (draw is None or self.dropout == 0.0)
        full = self.layers[:-1] if one_position else self.layers
        if len(full):
            layout = PaddedLayout(lengths, length)
            allowed = _allowed(layout, self.causal)
            rows = layout.rows(x)
            for layer in full:
                rows = layer(rows, layout, allowed, draw)
            x = layout.padded(rows)
        if self.output == "sequence":
            return x
        if not one_position:
            return _position_of(x, lengths, self.output)
        return self._one_position(x, lengths)

    def _one_position(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The last layer at each sample's first or last position only: [B, dim]."""
        # The keys are a prefix: all real positions, or under `causal` those up to the query's.
        # An empty sequence attends to its first position (no NaN); its output is zeroed below.
        if self.output == "last":
            position = (lengths - 1).clamp(min=0)
            counts = position + 1
        else:
            position = None
            counts = torch.ones_like(lengths) if self.causal else lengths.clamp(min=1)
        out = self.layers[-1].forward_at(x, position, counts)
        return out * (lengths > 0).unsqueeze(1).to(out.dtype)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, ffn_dim={self.ffn_dim}, "
            f"num_layers={self.num_layers}, norm_first={self.norm_first}, causal={self.causal}, "
            f"max_length={self.max_length}, activation={self.activation!r}, output={self.output!r}, "
            f"sasrec={self.sasrec}, norm_affine={self.norm_affine}, scale_input={self.scale_input}, "
            f"dropout={self.dropout}, input_dropout={self.input_dropout}, position_dim={self.position_dim}"
        )


def _position_of(x: torch.Tensor, lengths: torch.Tensor, output: str) -> torch.Tensor:
    """The first or last real position of each sample of x [B, L, dim]: [B, dim], zeros for an empty one."""
    if output == "first":
        return x[:, 0] * (lengths > 0).unsqueeze(1).to(x.dtype)
    return x[torch.arange(x.shape[0], device=x.device), (lengths - 1).clamp(min=0)]
