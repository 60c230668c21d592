"""Dropout at the several places of one sequence block, keyed by global sample (`transformer`, `hstu`).

A transformer layer drops elements of its input rows, its attention weights
and its feed-forward activations; torch's dropout would draw each mask from
the process's generator, so N ranks would not train what one process trains
on the global batch. These masks come from `runtime.modules.layers.dropout.keep_mask`
instead: element e of sample i at place `stream` of training step s is kept
as a function of (seed, stream, s, i, e) alone, i being the sample's index in
the global batch and e its element's row-major index in the sample's padded
[L, ...] form. A position's element index is position * width + column
whatever L is, so a sample's masks do not depend on how far its batch was
padded or on which rank it lands; attention weights [heads, L, L] are keyed
over the block's padded length, which the compiler fixes.

`SequenceDropout.draw` is called once per forward: it counts the step (a
persistent buffer, saved with checkpoints), finds the rank's first global
sample (one all-gather of the batch sizes when the block has a process group
of several ranks) and returns the `Draw` that every place of this forward
uses (each with its own probability), or None in eval mode.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from runtime.modules.layers.arguments import owner
from runtime.modules.layers.dropout import first_global_sample, keep_mask
from runtime.sparse.sequence import PaddedLayout

__all__ = ["Draw", "SequenceDropout"]


class Draw:
    """One training step's masks: `padded` for (B, ...) tensors, `rows` for a layout's real rows."""

    def __init__(self, seed: int, step: int, samples: torch.Tensor) -> None:
        self.seed, self.step, self.samples = seed, step, samples

    def _scale(self, p: float, stream: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        mask = keep_mask(p, self.seed, stream, self.step, self.samples, width)
        return mask.to(dtype).mul_(1.0 / (1.0 - p))

    def padded(self, x: torch.Tensor, p: float, stream: int) -> torch.Tensor:
        """x (B, ...) with dropout p, the mask over each sample's elements in row-major order."""
        if p == 0.0:
            return x
        return x * self._scale(p, stream, x[0].numel() if x.shape[0] else 0, x.dtype).view(x.shape)

    def rows(self, rows: torch.Tensor, layout: PaddedLayout, p: float, stream: int) -> torch.Tensor:
        """The real rows [sum(L), W] with dropout p: the masks `padded` draws for [B, L, W]."""
        if p == 0.0:
            return rows
        width = rows.shape[1]
        scale = self._scale(p, stream, layout.length * width, rows.dtype)
        return rows * layout.rows(scale.view(-1, layout.length, width))


class SequenceDropout(nn.Module):
    """The step counter and seed of a block's keyed dropout; see the module docstring."""

    def __init__(self, seed: int = 0, process_group: dist.ProcessGroup | None = None, where: str = "") -> None:
        super().__init__()
        name = owner("SequenceDropout", where)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"{name}: seed must be an integer >= 0 (got {seed!r})")
        self.seed = seed
        self.process_group = process_group
        self.register_buffer("step", torch.tensor(0, dtype=torch.long))

    def draw(self, batch: int, device: torch.device) -> Draw | None:
        """This forward's masks, or None in eval mode; counts a training step."""
        if not self.training:
            return None
        first = first_global_sample(batch, device, self.process_group)
        samples = torch.arange(first, first + batch, dtype=torch.int64, device=device)
        step = int(self.step)
        self.step.add_(1)
        return Draw(self.seed, step, samples)

    def extra_repr(self) -> str:
        return f"seed={self.seed}"
