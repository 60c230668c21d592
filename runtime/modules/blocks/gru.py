"""GRU: a recurrent encoder over jagged sequences (the `gru` block), plain or DIEN's AUGRU.

Takes a padded sequence [B, L, D] with its lengths [B] and returns the hidden
state at every position, [B, L, H], zeros past each sequence's length (an
empty sequence gives zeros): a `sequence_pool` with mode `last` reads the
final state. The sequences are packed over their lengths
(torch.nn.utils.rnn.pack_padded_sequence), so no step runs on padding, and
each sample's states are exactly what the GRU computes on that sample alone.

Without a query this is torch.nn.GRU (GRU4Rec's session encoder, DIEN's
interest extractor). With a query [B, Q] it is DIEN's interest evolution
layer (Zhou et al., AAAI 2019, section 4.3): an attention score a_t of the
query against each input h_t, then an AUGRU whose update gate is scaled by it

    u_t = sigmoid(W_u h_t + b_u + U_u s + c_u) * a_t
    r_t = sigmoid(W_r h_t + b_r + U_r s + c_r)
    n_t = tanh(W_n h_t + b_n + r_t * (U_n s + c_n))
    s'  = s + u_t * (n_t - s)                      (= (1 - u_t) s + u_t n_t)

as FuxiCTR's DIEN (model_zoo/DIEN: AUGRUCell in a packed loop) and
DeepCTR-Torch's AUGRUCell compute it. The score is FuxiCTR's default
`bilinear` a_t = h_t W q (W starts as the identity) or `dot` a_t = h_t . q,
softmax-normalised over the real positions unless `softmax` is false.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from runtime.modules.layers.arguments import check_size
from runtime.modules.layers.sequence_checks import check_sequence
from runtime.sparse.sequence import padding_mask

__all__ = ["ATTENTIONS", "GRU", "AUGRUCell"]

ATTENTIONS = ("bilinear", "dot")


class AUGRUCell(nn.Module):
    """One AUGRU step: (x [N, D], state [N, H], score [N]) -> the next state [N, H] (see the module docstring)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.x2h = nn.Linear(input_size, 3 * hidden_size)
        self.h2h = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, x: torch.Tensor, state: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        x_u, x_r, x_n = self.x2h(x).chunk(3, dim=1)
        h_u, h_r, h_n = self.h2h(state).chunk(3, dim=1)
        update = torch.sigmoid(x_u + h_u) * score.unsqueeze(1)
        reset = torch.sigmoid(x_r + h_r)
        new = torch.tanh(x_n + reset * h_n)
        return state + update * (new - state)


class GRU(nn.Module):
    """(x (B, L, dim), lengths (B,)[, query (B, query_dim)]) -> states (B, L, hidden_size).

    `query_dim` > 0 makes it DIEN's AUGRU (one layer) with `attention` and
    `softmax` scoring the inputs against the query; otherwise `num_layers`
    stacked nn.GRU layers.
    """

    def __init__(
        self,
        dim: int,
        hidden_size: int,
        num_layers: int = 1,
        query_dim: int = 0,
        attention: str = "bilinear",
        softmax: bool = True,
    ) -> None:
        super().__init__()
        self.dim = check_size("GRU", "dim", dim)
        self.hidden_size = check_size("GRU", "hidden_size", hidden_size)
        self.num_layers = check_size("GRU", "num_layers", num_layers)
        self.query_dim = check_size("GRU", "query_dim", query_dim, minimum=0)
        if attention not in ATTENTIONS:
            raise ValueError(f"GRU: unknown attention {attention!r} (expected one of: {', '.join(ATTENTIONS)})")
        self.attention, self.softmax = attention, bool(softmax)
        if not self.query_dim:
            self.gru = nn.GRU(dim, hidden_size, num_layers=num_layers, batch_first=True)
            return
        if num_layers != 1:
            raise ValueError(f"GRU: an attention-gated GRU (AUGRU) has one layer (got num_layers={num_layers})")
        if attention == "dot" and query_dim != dim:
            raise ValueError(f"GRU: dot attention needs a query as wide as the input {dim} (got {query_dim})")
        if attention == "bilinear":
            self.kernel = nn.Parameter(torch.eye(dim, query_dim))
        self.cell = AUGRUCell(dim, hidden_size)

    def scores(self, x: torch.Tensor, lengths: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The attention score of each position, [B, L]: zero on padding, summing to 1 with softmax."""
        keys = x @ self.kernel if self.attention == "bilinear" else x
        raw = (keys @ query.unsqueeze(2)).squeeze(2)
        mask = padding_mask(lengths, x.shape[1])
        if not self.softmax:
            return raw * mask.to(raw.dtype)
        # An empty sequence would be all -inf: its row is never read (no step runs on it).
        return raw.masked_fill(~mask, float("-inf")).softmax(dim=1).nan_to_num(0.0)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, query: torch.Tensor | None = None) -> torch.Tensor:
        check_sequence("GRU", x, lengths, self.dim)
        if (query is None) != (not self.query_dim):
            wanted = f"a query of width {self.query_dim}" if self.query_dim else "no query"
            raise ValueError(f"GRU: this GRU takes {wanted}")
        if query is not None and query.shape != (x.shape[0], self.query_dim):
            raise ValueError(
                f"GRU: expected a query of shape ({x.shape[0]}, {self.query_dim}), got {tuple(query.shape)}"
            )
        batch, length, _ = x.shape
        out = x.new_zeros(batch, length, self.hidden_size)
        real = lengths > 0
        if not bool(real.any()):
            return out
        kept = lengths[real].cpu()
        packed = pack_padded_sequence(x[real], kept, batch_first=True, enforce_sorted=False)
        if query is None:
            states, _ = self.gru(packed)
        else:
            scores = self.scores(x[real], lengths[real], query[real]).unsqueeze(2)
            packed_scores = pack_padded_sequence(scores, kept, batch_first=True, enforce_sorted=False)
            states = self._augru(packed, packed_scores.data.squeeze(1))
        padded, _ = pad_packed_sequence(states, batch_first=True, total_length=length)
        out[real] = padded
        return out

    def _augru(self, packed: PackedSequence, scores: torch.Tensor) -> PackedSequence:
        """The AUGRU over a packed batch: at step t only the batch_sizes[t] sequences still running."""
        state = packed.data.new_zeros(int(packed.batch_sizes[0]), self.hidden_size)
        steps, start = [], 0
        for size in packed.batch_sizes.tolist():
            state = self.cell(packed.data[start : start + size], state[:size], scores[start : start + size])
            steps.append(state)
            start += size
        return PackedSequence(torch.cat(steps), packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)

    def extra_repr(self) -> str:
        gate = ""
        if self.query_dim:
            gate = f", query_dim={self.query_dim}, attention={self.attention}, softmax={self.softmax}"
        return f"dim={self.dim}, hidden_size={self.hidden_size}, num_layers={self.num_layers}{gate}"
