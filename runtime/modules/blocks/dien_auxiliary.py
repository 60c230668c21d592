"""DIEN's auxiliary next-behaviour loss (Zhou et al., AAAI 2019, section 4.2, equation 1).

The interest extractor's state h_t after behaviour t should tell the next
clicked item e_{t+1} from an item the user did not click: for each position
t < length - 1 a small network scores concat(h_t, e_{t+1}) as clicked and
concat(h_t, n_{t+1}) as not clicked, n_{t+1} a negative item's embedding.

The scorer is the authors' `auxiliary_net` (github mouna99/dien,
script/model.py): dense 100, sigmoid, dense 50, sigmoid, dense 2, a 2-way
softmax whose first column is the probability of a click. DeepCTR-Torch's
and FuxiCTR's DIEN use the same widths ending in one sigmoid unit under a
binary cross-entropy: the same function class (a 2-way softmax is the sigmoid
of its logits' difference), so we keep the authors' layout, whose parameters
their trained figures come from. We do not score by a dot product h_t . e:
it would tie the extractor's width to the item's. Two numerical differences:
the authors add 1e-8 to the softmax before its log (we take log_softmax, exact
and finite), and their first layer is a batch norm that TF1's
`tf.layers.batch_normalization` builds in inference mode (training=False by
default), i.e. a per-feature affine map on fixed statistics, which the first
dense layer already spans; it is left out.

The loss is the authors' `auxiliary_loss`: the per-position losses masked to
the real positions and summed, divided by batch * (max_length - 1), the
authors' reduce_mean over the [B, T - 1] grid (they pad to the batch's
longest history, so their T varies by batch; ours is the spec's
max_length). With a fixed max_length the denominator depends on the local
batch size only,
as a head's mean loss does, so N ranks averaging their gradients train what
one process trains on the global batch. (DeepCTR-Torch divides by the number
of real positions instead, which would need the global count from every rank;
FuxiCTR's alpha > 0 path multiplies a [2 B (T-1), 1] loss by a [B (T-1), 1]
mask, which cannot broadcast.)
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.modules.layers.arguments import check_size
from runtime.sparse.sequence import padding_mask

__all__ = ["AuxiliaryNet", "auxiliary_loss"]


class AuxiliaryNet(nn.Module):
    """(states [..., H], items [..., D]) -> log-probabilities [..., 2]: column 0 clicked, 1 not clicked."""

    def __init__(self, hidden_size: int, item_dim: int) -> None:
        super().__init__()
        width = check_size("AuxiliaryNet", "hidden_size", hidden_size) + check_size(
            "AuxiliaryNet", "item_dim", item_dim
        )
        self.layers = nn.Sequential(
            nn.Linear(width, 100), nn.Sigmoid(), nn.Linear(100, 50), nn.Sigmoid(), nn.Linear(50, 2)
        )

    def forward(self, states: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.cat([states, items], dim=-1)).log_softmax(dim=-1)


def auxiliary_loss(
    net: AuxiliaryNet,
    states: torch.Tensor,
    items: torch.Tensor,
    negatives: torch.Tensor,
    lengths: torch.Tensor,
    max_length: int,
) -> torch.Tensor:
    """The auxiliary loss of a batch: states [B, L, H], items and negatives [B, L, D], lengths [B].

    Position t pairs states[:, t] with items[:, t + 1] (clicked) and
    negatives[:, t + 1] (not clicked); only t < lengths - 1 counts, so a
    history of length 0 or 1 adds nothing (a batch padded to one position
    still runs the net on no rows, so its parameters get zero gradients, not
    none, as on every other rank). The sum is divided by
    B * (max_length - 1), max_length >= 2 the spec's history length.
    """
    batch, length, _ = states.shape
    if max_length < 2 or length > max_length:
        raise ValueError(
            f"auxiliary_loss: max_length must be >= 2 and >= the padded length {length} (got {max_length})"
        )
    mask = padding_mask(lengths - 1, length - 1).to(states.dtype)
    clicked = net(states[:, :-1], items[:, 1:])[..., 0]
    skipped = net(states[:, :-1], negatives[:, 1:])[..., 1]
    return -((clicked + skipped) * mask).sum() / (batch * (max_length - 1))
