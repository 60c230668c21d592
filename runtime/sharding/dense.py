"""The dense part of a sharded model: DistributedDataParallel beside SparseArch.

`distribute_dense(model, process_group)` wraps the whole model in DDP (gloo
on CPU, NCCL on CUDA: whatever backs the group) with every parameter and
buffer of its SparseArch modules ignored. SparseArch owns no parameters DDP
could see anyway: the embedding kernels apply their optimizers in backward
to the local shards only, and its collectives run inside the model's forward
and backward. DDP averages the dense gradients over the ranks, which with
each rank's loss the mean over its own batch gives the gradient of the
global-batch mean, as one process would compute it.

The training pipeline (runtime/train/train_pipeline.py) calls the model's two stages
through the wrapper: `input_dist` outside DDP, `compute` as DDP's forward.

Buffers are synced once, when DDP is built, not before every step
(`forward_sync_buffers=False`): the dense blocks hold only constant index
buffers, and broadcasting them would cost a collective per step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runtime.sharding.sparse_arch import SparseArch


class DenseDataParallel(DistributedDataParallel):
    """DDP that still offers the model's `loss`, `dense_parameters` and pipeline stages."""

    def loss(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.module.loss(*args, **kwargs)

    def input_dist(self, *args: Any) -> Any:
        """Stage 0 (runtime/train/train_pipeline.py), outside DDP: it touches no dense parameter."""
        return self.module.input_dist(*args)

    def compute(self, *staged: Any) -> Any:
        """Stage 1 as DDP's forward, so DDP prepares the gradient all-reduce as for `forward`.

        DDP runs `self.module(...)`, i.e. the model's `forward`; for this call
        that is the model's `compute` (an instance attribute shadows the method).
        """
        self.module.forward = self.module.compute
        try:
            return self(*staged)
        finally:
            del self.module.forward

    def dense_parameters(self) -> list[nn.Parameter]:
        return self.module.dense_parameters()


def distribute_dense(model: nn.Module, process_group: dist.ProcessGroup | None) -> nn.Module:
    """`model` with its dense part in DDP over `process_group`; `model` itself on one rank."""
    if process_group is None or dist.get_world_size(process_group) == 1:
        return model
    ignored = [
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if isinstance(module, SparseArch)
        for name, _ in [*module.named_parameters(), *module.named_buffers()]
    ]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return DenseDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=process_group,
        forward_sync_buffers=False,
        gradient_as_bucket_view=True,
    )
