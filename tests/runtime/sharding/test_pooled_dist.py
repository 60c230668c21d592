"""The pooled all-to-all frees its buffers after backward (two ranks, gloo).

The exchange is kept on the autograd context; while it still held the
received values or their gradient, each step's buffers formed a cycle
through the autograd graph that Python's collector cannot break, and
training grew by every step's pooled embeddings (~100 MB a step in
dlrm-bench dist2).
"""

from __future__ import annotations

import datetime
import gc
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import sharded_cases as sc
from runtime.sharding.pooled_dist import all_to_all_pooled
from runtime.train.process_group import close_process_group, init_process_group
import rendezvous


def _run(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo", store=rendezvous.client(port, 2, datetime.timedelta(seconds=60)), rank=rank,
        world_size=2, timeout=datetime.timedelta(seconds=60),
    )
    values = torch.arange(8.0, requires_grad=True)
    # Rank r sends arange(8) * (r + 1): its first half to rank 0, its second to rank 1.
    received = all_to_all_pooled(values * (rank + 1), [4, 4], [4, 4], dist.group.WORLD).wait()
    freed = weakref.ref(received)
    mine = torch.arange(4.0 * rank, 4.0 * rank + 4)
    exact = torch.equal(received.detach(), torch.cat([mine, 2 * mine]))
    received.sum().backward()
    del received
    gc.collect()
    result = [freed() is None, exact, values.grad.tolist()]
    gathered: list = [None, None]
    dist.all_gather_object(gathered, result)
    if rank == 0:
        torch.save(gathered, Path(out) / "pooled.pt")
    close_process_group()


def test_the_received_values_are_freed_after_backward(tmp_path: Path) -> None:
    with rendezvous.hosted_store() as port:
        mp.spawn(_run, args=(port, str(tmp_path)), nprocs=2)
    for rank, (freed, exact, grad) in enumerate(torch.load(tmp_path / "pooled.pt")):
        assert exact
        assert freed, "the pooled all-to-all's output outlived its step"
        # Every value reaches one rank once; gradients are divided by the world size.
        assert grad == [(rank + 1) / 2] * 8
