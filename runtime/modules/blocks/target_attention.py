"""TargetAttention: DIN's attention of a target over a behaviour sequence (the `target_attention` block).

For a query q [B, D] (the target item, or any block's output of width D) and
keys k [B, L, D] with lengths, each real position l gets a score

    s_l = MLP([q, k_l, q - k_l, q * k_l])        (hidden layers, then one output)

and the output is sum_l s_l * k_l over the real positions: DIN's weighted sum,
with the scores not softmax-normalised (Zhou et al. 2018, section 4.3: the
sum keeps the intensity of the user's interest). Padding scores 0, so an
empty sequence gives zeros. With `normalize` "softmax" the weights are
softmax(s) over the real positions instead, as TorchEasyRec's DINEncoder
computes them; an empty sequence gives zeros there too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from runtime.modules.blocks.pooled import MLP, _check_layers, _check_size
from runtime.modules.layers.sequence_checks import check_sequence
from runtime.sparse.sequence import padding_mask

__all__ = ["NORMALIZE", "TargetAttention", "join_fields"]

NORMALIZE = ("none", "softmax")


def join_fields(sequences: list[torch.Tensor], lengths: list[torch.Tensor]) -> torch.Tensor:
    """Padded sequence fields of one history [B, L, D_i] joined position by position: [B, L, sum D_i].

    The fields (a history's item ids, categories, brands, ...) describe the same positions, so every
    sample has one length in all of them; a sample whose lengths differ is an error naming it.
    """
    first = lengths[0]
    for other in lengths[1:]:
        differs = torch.nonzero(other != first)
        if differs.numel():
            b = int(differs[0, 0])
            raise ValueError(
                f"target_attention: the joined sequences have different lengths in sample {b} "
                f"({int(first[b])} and {int(other[b])}); each field must describe the same positions"
            )
    return torch.cat(sequences, dim=2)


class TargetAttention(nn.Module):
    """(query (B, dim), keys (B, L, dim), lengths (B,)) -> (B, dim).

    `hidden` are the attention MLP's hidden widths, each followed by
    `activation` (a name of `runtime.modules.blocks.pooled.ACTIVATIONS`); the last
    layer is linear with one output. `normalize`: "none" (DIN's raw scores)
    or "softmax" over the real positions.
    """

    def __init__(
        self, dim: int, hidden: Sequence[int] = (80, 40), activation: str = "sigmoid", normalize: str = "none"
    ) -> None:
        super().__init__()
        self.dim = _check_size("TargetAttention", "dim", dim)
        if normalize not in NORMALIZE:
            raise ValueError(
                f"TargetAttention: unknown normalize {normalize!r} (expected one of: {', '.join(NORMALIZE)})"
            )
        self.normalize = normalize
        self.hidden = _check_layers("TargetAttention", "hidden", hidden)
        try:
            self.scorer = MLP(4 * dim, [*self.hidden, 1], activation=activation, final_activation=None)
        except ValueError as error:
            raise ValueError(str(error).replace("MLP:", "TargetAttention:", 1)) from None

    def forward(self, query: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        check_sequence("TargetAttention", keys, lengths, self.dim)
        if query.shape != (keys.shape[0], self.dim):
            raise ValueError(
                f"TargetAttention: expected a query of shape ({keys.shape[0]}, {self.dim}), got {tuple(query.shape)}"
            )
        batch, length, dim = keys.shape
        q = query.unsqueeze(1).expand(-1, length, -1)
        features = torch.cat([q, keys, q - keys, q * keys], dim=2)
        scores = self.scorer(features.reshape(batch * length, 4 * dim)).view(batch, length, 1)
        real = padding_mask(lengths, length).unsqueeze(2)
        if self.normalize == "softmax":
            # Padding takes the lowest finite score (no NaN for an empty sequence, whose weights the mask zeroes).
            masked = scores.masked_fill(~real, torch.finfo(scores.dtype).min)
            scores = torch.softmax(masked, dim=1) * real.to(scores.dtype)
        else:
            scores = scores * real.to(scores.dtype)
        return (scores * keys).sum(dim=1)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, normalize={self.normalize!r}"
