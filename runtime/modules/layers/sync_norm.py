"""Batch normalisation whose batch statistics span every rank of a process group.

N ranks each holding a slice of the global batch must train exactly what one
process would on the whole batch, so the mean and variance that normalise a
sample are the global batch's: each rank sums its count, sum and sum of
squares per channel (each value squared and summed in float64, so that
E[x^2] - E[x]^2 does not cancel for a channel whose mean is large against
its spread), one all-reduce adds them up, and every rank derives the same
global mean and biased variance. The all-reduce is differentiable (its
backward all-reduces the gradient of the sums), so a sample's gradient
includes the effect it has on every other rank's outputs through the
statistics. With DDP averaging the parameter gradients and each rank's loss
the mean over its own slice, the gradients are the one-process gradients of
the global-batch mean, as torch's SyncBatchNorm arranges.

The running statistics are updated from the global statistics (the variance
unbiased with the global count), so they are the same on every rank and the
same as one process's. Parameters and buffers are named as torch's
nn.BatchNorm1d names them, so its state dict loads unchanged.

Channels are the last dimension: a [B, C] batch or a [B, N, C] field stack
(statistics over B and N). Without a group, or with a group of one rank,
nothing is communicated.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from runtime.modules.layers.arguments import check_size, owner

__all__ = ["SyncBatchNorm"]


class _AllReduceSum(torch.autograd.Function):
    """sum over the group's ranks; backward: the gradient summed over the ranks the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        total = x.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


def _check_unit(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}: {name} must be a number in [0, 1] (got {value!r})")
    return float(value)


class SyncBatchNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, mean and var over the global batch.

    In eval mode the running statistics normalise, with no communication.
    `momentum` weighs the new statistics in the running ones, as in torch.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        process_group: dist.ProcessGroup | None = None,
        where: str = "",
        affine: bool = True,
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("SyncBatchNorm", where)
        self.num_features = check_size(name, "num_features", num_features)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"{name}: eps must be a number > 0 (got {eps!r})")
        self.eps = float(eps)
        self.momentum = _check_unit(name, "momentum", momentum)
        self.process_group = process_group
        # Without `affine` (Dice's normalisation) there is no weight or bias, as in torch's BatchNorm1d.
        self.weight: nn.Parameter | None = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias: nn.Parameter | None = nn.Parameter(torch.zeros(num_features)) if affine else None
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def _distributed(self) -> bool:
        group = self.process_group
        return group is not None and dist.get_world_size(group) > 1

    def _global_sums(self, rows: torch.Tensor) -> torch.Tensor:
        """[3, C] float64: the count, sum and sum of squares of every rank's rows, added up."""
        count = torch.full((self.num_features,), float(rows.shape[0]), dtype=torch.float64, device=rows.device)
        wide = rows.double()  # squared in float64 too: a float32 square of 1000.01 is already off by 0.06
        local = torch.stack([count, wide.sum(0), wide.square().sum(0)])
        return _AllReduceSum.apply(local, self.process_group) if self._distributed() else local

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = owner("SyncBatchNorm", self.where)
        if x.dim() not in (2, 3) or x.shape[-1] != self.num_features:
            raise ValueError(
                f"{name}: expected input of shape (B, {self.num_features}) or (B, N, {self.num_features}), "
                f"got {tuple(x.shape)}"
            )
        if not self.training:
            mean, var = self.running_mean, self.running_var
            normalised = (x - mean) * torch.rsqrt(var + self.eps)
            if self.weight is None or self.bias is None:
                return normalised
            return normalised * self.weight + self.bias
        count, total, squares = self._global_sums(x.reshape(-1, self.num_features))
        n = int(count[0])
        if n < 2:
            raise ValueError(f"{name}: training needs more than 1 value per channel, got {n} in the global batch")
        mean = total / n
        var = (squares / n - mean.square()).clamp_min(0.0)
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
            self.running_var.mul_(1 - m).add_((var * (n / (n - 1))).to(self.running_var.dtype), alpha=m)
            self.num_batches_tracked.add_(1)
        scale = torch.rsqrt(var + self.eps).to(x.dtype)
        if self.weight is None or self.bias is None:
            return (x - mean.to(x.dtype)) * scale
        return (x - mean.to(x.dtype)) * (scale * self.weight) + self.bias

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"
