"""At two ranks, DDP's gradient all-reduce goes through the shared-memory exchange (runtime/sharding/dense.py).

Two ranks train a small dense model twice from the same weights on the same
batches: once through `distribute_dense` (the exchange as DDP's
communication hook), once in plain DDP (gloo's all-reduce). The gradients
and the weights must be the same bits at every step, and the hook's
exchanges are counted: one a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import rendezvous
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runtime.process import shm_exchange
from runtime.sharding.dense import distribute_dense
from runtime.train.process_group import close_process_group

STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 1))


def _train(model: nn.Module, rank: int) -> list[list[torch.Tensor]]:
    """Each step's gradients then weights, after an SGD step on this rank's batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step in range(STEPS):
        batch = torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * step + rank))
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
        seen.append([p.grad.clone() for p in model.parameters()] + [p.detach().clone() for p in model.parameters()])
    return seen


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
    exchanges, original = [0], shm_exchange.all_to_all_single

    def counted(*args: Any, **kwargs: Any) -> Any:
        exchanges[0] += 1
        return original(*args, **kwargs)

    shm_exchange.all_to_all_single = counted  # type: ignore[assignment]
    try:
        hooked = _train(distribute_dense(_model(), dist.group.WORLD), rank)
    finally:
        shm_exchange.all_to_all_single = original  # type: ignore[assignment]
    plain = _train(DistributedDataParallel(_model(), process_group=dist.group.WORLD), rank)
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, {"hooked": hooked, "plain": plain, "exchanges": exchanges[0]})
    if rank == 0:
        torch.save(gathered, Path(out) / "ranks.pt")
    close_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("dense")
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(out)), nprocs=2)
    return torch.load(out / "ranks.pt", weights_only=False)


def test_the_exchange_all_reduce_is_gloos_bit_for_bit(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert len(rank["hooked"]) == STEPS
        for hooked, plain in zip(rank["hooked"], rank["plain"], strict=True):
            assert all(torch.equal(h, p) for h, p in zip(hooked, plain, strict=True))
    # the ranks hold the same gradients and weights (the mean over both batches)
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["hooked"][-1], ranks[1]["hooked"][-1], strict=True))


def test_one_exchange_a_step(ranks: list[dict[str, Any]]) -> None:
    assert [rank["exchanges"] for rank in ranks] == [STEPS, STEPS]
