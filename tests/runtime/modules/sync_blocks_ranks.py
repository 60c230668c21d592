"""Rank entry points of test_sync_blocks.py: an MLP with BatchNorm, dropout and Dice trained on 2 gloo ranks.

Batches are made globally from the step number and sliced per rank, so the
two ranks together see exactly the batch one process sees. Rank 0 saves what
both ranks computed (gathered), for the test to compare with one process.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import rendezvous
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from runtime.modules.blocks.pooled import MLP
from runtime.train.process_group import close_process_group, init_process_group

WORLD_SIZE = 2
GLOBAL_BATCH = 8
STEPS = 3
IN_FEATURES = 6
UNEVEN = (5, 3)  # local batch sizes of the forward-only check


def make_model(process_group: dist.ProcessGroup | None) -> MLP:
    torch.manual_seed(0)
    return MLP(
        IN_FEATURES,
        [8, 8, 1],
        activation="dice",
        final_activation=None,
        norm="batch",
        dropout=0.3,
        residual=True,
        seed=3,
        process_group=process_group,
    )


def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=gen) * 2 + 1
    labels = torch.randint(0, 2, (GLOBAL_BATCH, 1), generator=gen).float()
    return x, labels


def train(model: MLP, rank: int, world_size: int) -> dict[str, Any]:
    """STEPS steps of SGD, each rank's loss the mean over its slice; what each step computed."""
    trained = model if world_size == 1 else DistributedDataParallel(model, forward_sync_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    local = GLOBAL_BATCH // world_size
    record: dict[str, Any] = {"outputs": [], "input_grads": [], "grads": []}
    for step in range(STEPS):
        x, labels = make_batch(step)
        x = x[rank * local : (rank + 1) * local].clone().requires_grad_()
        out = trained(x)
        loss = F.binary_cross_entropy_with_logits(out, labels[rank * local : (rank + 1) * local])
        optimizer.zero_grad()
        loss.backward()
        record["outputs"].append(gather(out.detach(), world_size))
        record["input_grads"].append(gather(x.grad, world_size))
        record["grads"].append({name: p.grad.clone() for name, p in model.named_parameters()})
        optimizer.step()
    record["state"] = {name: t.clone() for name, t in model.state_dict().items()}
    return record


def forward_uneven(model: MLP, rank: int, world_size: int) -> dict[str, Any]:
    """Two training-mode forwards over slices of UNEVEN sizes; dropout finds its first sample itself."""
    sizes = UNEVEN if world_size > 1 else (GLOBAL_BATCH,)
    first = sum(sizes[:rank])
    outputs = []
    with torch.no_grad():
        for step in range(2):
            x, _ = make_batch(step)
            outputs.append(gather_uneven(model(x[first : first + sizes[rank]]), sizes))
    return {"outputs": outputs, "state": {name: t.clone() for name, t in model.state_dict().items()}}


def gather(t: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def gather_uneven(t: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    if len(sizes) == 1:
        return t
    # gloo gathers equal sizes only: pad every slice to the largest, then cut.
    padded = torch.zeros(max(sizes), *t.shape[1:])
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


def run(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo",
        store=rendezvous.client(port, WORLD_SIZE, datetime.timedelta(seconds=60)),
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=60),
    )
    group = dist.group.WORLD
    results = {
        "train": train(make_model(group), rank, WORLD_SIZE),
        "uneven": forward_uneven(make_model(group), rank, WORLD_SIZE),
    }
    # Every rank's own parameter gradients and state, to check that both ranks hold the same.
    held = [None] * WORLD_SIZE
    dist.gather_object(
        {"grads": results["train"]["grads"], "state": results["train"]["state"]},
        held if rank == 0 else None,
        dst=0,
    )
    results["rank1"] = held[1]
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    close_process_group()
