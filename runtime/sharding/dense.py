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

At two ranks on CPU of one host the gradient all-reduce goes through the
embeddings' shared-memory exchange (runtime/process/shm_exchange.py) as
DDP's communication hook: each rank sends its whole bucket, divided by the
world size as DDP does, and adds the two in rank order. At two ranks that
moves the bytes of gloo's ring in one exchange, and a + b is the sum gloo
computes, bit for bit; it spares gloo's loopback TCP and its threads the two
cores the ranks train on. Beyond two ranks each would receive every rank's
bucket, so DDP's own all-reduce stays. The exchange runs when the backward
has run to its end (an autograd final callback, queued before DDP's own,
which waits for it): a group's exchanges must come in the same order on
every rank, and where a bucket becomes ready among the embeddings' own
backward exchanges is autograd's choice, which may differ by rank (the
ranks' graphs differ where they hold different tables). So the embeddings'
gradients also leave before the dense all-reduce. Where the ranks do not
share memory (other hosts, RECCOMPILE_EXCHANGE=gloo) DDP's all-reduce stays,
overlapped with the backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel

from runtime.process import shm_exchange
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
    """`model` with its dense part in DDP over `process_group`; `model` itself on one rank, or
    where it has no dense part."""
    if process_group is None or dist.get_world_size(process_group) == 1:
        return model
    ignored = [
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if isinstance(module, SparseArch)
        for name, _ in [*module.named_parameters(), *module.named_buffers()]
    ]
    if not any(p.requires_grad for name, p in model.named_parameters() if name not in ignored):
        return model  # tables alone (matrix factorisation): nothing for DDP to reduce, and DDP refuses it
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    wrapped = DenseDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=process_group,
        forward_sync_buffers=False,
        gradient_as_bucket_view=True,
    )
    if device.type == "cpu" and dist.get_world_size(process_group) == 2 and shm_exchange.shares_memory(process_group):
        # unannotated: DDP compares a hook's annotations with the classes, which postponed ones are not
        wrapped.register_comm_hook(process_group, lambda group, bucket: exchange_all_reduce(group, bucket))
    return wrapped


def exchange_all_reduce(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's all-reduce of one bucket (the mean over the ranks) as one all-to-all of the whole
    bucket through the exchange, summed in rank order, at the end of the backward (see the
    module docstring)."""
    buffer = bucket.buffer()
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def reduce() -> None:
        world_size = dist.get_world_size(process_group)
        sent = buffer.div_(world_size).repeat(world_size)
        received = torch.empty_like(sent)
        shm_exchange.all_to_all_single(received, sent, None, None, group=process_group)
        torch.sum(received.view(world_size, -1), dim=0, out=buffer)
        done.set_result(buffer)

    Variable._execution_engine.queue_callback(reduce)
    return done
