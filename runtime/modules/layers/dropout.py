"""Dropout whose mask of a sample does not depend on how the batch is split over ranks.

torch's dropout draws its mask from the process's generator, so a sample's
mask depends on where in which rank's slice it lands: N ranks would not
train what one process trains on the global batch. `KeyedDropout` draws the
mask from a counter-based generator instead: the keep bit of element j of
sample i is a function of (seed, stream, step, i, j) alone, where i is the
sample's index in the global batch (the rank's first global sample index
plus its local index) and step counts the training forwards of the module
(a persistent buffer, so it is saved and restored with checkpoints).
`stream` tells apart the dropout layers of one model sharing a seed.

The generator is an integer hash (two rounds of the 32-bit xor-shift-multiply
mixer 0x45d9f3b) over int64 tensors holding 32-bit values, so no product
exceeds 2^59 and every device computes the same bits. An element is kept
when the top 24 bits of its hash, read as a fraction of 2^24, are >= p, and
kept elements are scaled by 1 / (1 - p), as in torch's dropout.

The rank's first global sample index is `first_sample`; when it is None and
the module has a process group of several ranks, it is the number of samples
of the lower ranks, found by one all-gather of the batch sizes per forward.
A training loop that knows it sets `first_sample` and saves the collective.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from runtime.modules.layers.arguments import check_probability, owner

__all__ = ["KeyedDropout", "derive_seed", "first_global_sample", "keep_mask"]

_MASK32 = 0xFFFFFFFF
_MIXER = 0x45D9F3B
_GOLDEN = 0x9E3779B9


def _mix_(h: torch.Tensor) -> torch.Tensor:
    """In place: a 32-bit hash of the 32-bit values held in int64 `h` (products stay below 2^59)."""
    for _ in range(2):
        h.bitwise_xor_(h >> 16).mul_(_MIXER).bitwise_and_(_MASK32)
    return h.bitwise_xor_(h >> 16)


def _mix_int(h: int) -> int:
    h = ((h >> 16) ^ h) * _MIXER & _MASK32
    h = ((h >> 16) ^ h) * _MIXER & _MASK32
    return (h >> 16) ^ h


def _combine(h: int, key: int) -> int:
    return _mix_int((h + (key & _MASK32) * _GOLDEN) & _MASK32)


def derive_seed(seed: int, *keys: int) -> int:
    """A 32-bit seed for a part of a block (e.g. layer i of a stack) that other parts do not share."""
    h = _mix_int(seed & _MASK32)
    for key in keys:
        h = _combine(h, key)
    return h


def keep_mask(p: float, seed: int, stream: int, step: int, samples: torch.Tensor, width: int) -> torch.Tensor:
    """[len(samples), width] bool: which elements of these global samples are kept at this step."""
    base = _combine(_combine(_combine(_mix_int(0), seed), stream), step)
    columns = torch.arange(width, dtype=torch.int64, device=samples.device)
    rows = _mix_((samples.to(torch.int64) * _GOLDEN + base).bitwise_and_(_MASK32))
    bits = _mix_((rows[:, None] + columns[None, :] * _GOLDEN).bitwise_and_(_MASK32))
    threshold = int(p * (1 << 24))
    return (bits >> 8) >= threshold


def first_global_sample(batch: int, device: torch.device, group: dist.ProcessGroup | None) -> int:
    """The global index of this rank's first sample: the batch sizes of the lower ranks, summed."""
    if group is None or dist.get_world_size(group) == 1:
        return 0
    mine = torch.tensor([batch], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, mine, group=group)
    return int(sum(int(s) for s in sizes[: dist.get_rank(group)]))


class KeyedDropout(nn.Module):
    """Dropout with probability p; the mask keyed by (seed, stream, step, global sample, element).

    Shapes: (B, ...) -> (B, ...); the elements of a sample are its entries
    in row-major order. Identity in eval mode and when p is 0.
    """

    def __init__(
        self,
        p: float,
        seed: int = 0,
        stream: int = 0,
        process_group: dist.ProcessGroup | None = None,
        first_sample: int | None = None,
        where: str = "",
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("KeyedDropout", where)
        self.p = check_probability(name, "p", p)
        for key, value in (("seed", seed), ("stream", stream)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: {key} must be an integer >= 0 (got {value!r})")
        self.seed = seed
        self.stream = stream
        self.process_group = process_group
        self.first_sample = first_sample
        self.register_buffer("step", torch.tensor(0, dtype=torch.long))

    def _first_sample(self, batch: int, device: torch.device) -> int:
        if self.first_sample is not None:
            return self.first_sample
        return first_global_sample(batch, device, self.process_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.dim() < 1:
            raise ValueError(f"{owner('KeyedDropout', self.where)}: expected input of shape (B, ...), got ()")
        batch = x.shape[0]
        first = self._first_sample(batch, x.device)
        samples = torch.arange(first, first + batch, dtype=torch.int64, device=x.device)
        mask = keep_mask(self.p, self.seed, self.stream, int(self.step), samples, math.prod(x.shape[1:]))
        self.step.add_(1)
        scale = mask.to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * scale.view(x.shape)

    def extra_repr(self) -> str:
        return f"p={self.p}, seed={self.seed}, stream={self.stream}"
