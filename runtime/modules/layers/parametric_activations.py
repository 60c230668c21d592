"""Activations with parameters of their own: PReLU and DIN's Dice, one module per MLP layer.

Dice (Zhou et al., "Deep Interest Network", KDD 2018, section 4.3) is a
PReLU whose rectification point follows the data:

    p(s) = sigmoid((s - E[s]) / sqrt(Var[s] + eps)),   f(s) = p(s) s + (1 - p(s)) alpha s

with E and Var the batch's per-channel statistics in training and running
averages in eval, and alpha learned per channel from 0 (FuxiCTR's Dice:
BatchNorm1d without affine, eps 1e-9, momentum 0.01). The statistics are
the global batch's (SyncBatchNorm over the process group), so N ranks train
what one process trains. PReLU is torch.nn.PReLU: one slope, from 0.25.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from runtime.modules.layers.sync_norm import SyncBatchNorm

__all__ = ["PARAMETRIC_ACTIVATIONS", "Dice", "parametric_activation"]

PARAMETRIC_ACTIVATIONS = ("prelu", "dice")


class Dice(nn.Module):
    """(B, width) -> (B, width): the Dice of each channel (see the module docstring)."""

    def __init__(
        self, width: int, process_group: dist.ProcessGroup | None = None, where: str = "", eps: float = 1e-9
    ) -> None:
        super().__init__()
        self.norm = SyncBatchNorm(width, eps=eps, momentum=0.01, process_group=process_group, where=where, affine=False)
        self.alpha = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(self.norm(x))
        return p * x + (1 - p) * self.alpha * x


def parametric_activation(
    name: str, width: int, process_group: dist.ProcessGroup | None = None, where: str = ""
) -> nn.Module:
    """The module of `name` (one of PARAMETRIC_ACTIVATIONS) for a layer `width` wide."""
    if name == "prelu":
        return nn.PReLU()
    assert name == "dice", name
    return Dice(width, process_group, where)
