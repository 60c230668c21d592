"""The pooled all-to-all: it frees its buffers after backward (two ranks, gloo), and the
receiver's placement of the owners' columns in key order, forward and backward.

The exchange is kept on the autograd context; while it still held the
received values or their gradient, each step's buffers formed a cycle
through the autograd graph that Python's collector cannot break, and
training grew by every step's pooled embeddings (~100 MB a step in
dlrm-bench dist2).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import rendezvous
import sharded_cases as sc
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.cpu import choice
from runtime.modules.blocks.pooled import DotInteraction
from runtime.sharding.group import slot_columns
from runtime.sharding.layout import group_keys, slots_by_rank, table_layouts
from runtime.sharding.pooled_dist import PooledOutputDist, all_to_all_pooled
from runtime.train.process_group import close_process_group


def _run(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
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


def test_owners_columns_are_placed_in_key_order_and_gradients_go_back_where_they_came_from() -> None:
    """column_wise over 2 ranks: t2's shards sit on ranks [1, 0, 0], so rank 0's block holds t2's
    columns 4..12 after t0's and t1's first halves, and rank 1's holds t2's first 4 columns between
    t1's second half and t3, t4 (test_layout.py). The output's column c is received column j of its
    owner's block (slot_columns), and the gradient of the received buffer is the output's gradient
    put back at those places."""
    layouts = table_layouts(sc.TABLES, sc.make_plan({t.name: "column_wise" for t in sc.TABLES}), 2)
    keys, dims = group_keys(layouts)
    slots = slots_by_rank(layouts, 2)
    placing = PooledOutputDist(keys, dims, slots, 0, None, partial_sums=False)
    batch, widths = 3, [len(slot_columns(s, dims)) for s in slots]
    received = torch.randn(batch * sum(widths), dtype=torch.float64, requires_grad=True)
    out = placing.keyed(received, batch).values()

    blocks = received.detach().split([batch * w for w in widths])
    expected = torch.empty(batch, sum(dims), dtype=torch.float64)
    for rank, block in enumerate(blocks):
        expected[:, slot_columns(slots[rank], dims)] = block.view(batch, -1)
    assert torch.equal(out.detach(), expected)

    grad = torch.randn(batch, sum(dims), dtype=torch.float64)
    (received_grad,) = torch.autograd.grad(out, received, grad)
    expected_grad = torch.cat([grad[:, slot_columns(s, dims)].reshape(-1) for s in slots])
    assert torch.equal(received_grad, expected_grad)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("kind", ["table_wise", "column_wise"])
def test_the_dot_interaction_reads_the_received_pieces_where_they_lie(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key's columns are whole 4-vectors, in pieces of both ranks' blocks (table_wise: t0, t2,
    t4 on rank 1 and t1, t3 on rank 0; column_wise: the shards above): the C dot reads them in the
    buffer, with no placed copy in the graph, and gives the float64 formula's output and gradients
    (the received buffer's in its own layout)."""
    monkeypatch.setenv(choice.ENV, "dot=native")
    layouts = table_layouts(sc.TABLES, sc.make_plan({t.name: kind for t in sc.TABLES}), 2)
    keys, dims = group_keys(layouts)
    slots = slots_by_rank(layouts, 2)
    placing = PooledOutputDist(keys, dims, slots, 0, None, partial_sums=False)
    batch, width = 5, sum(len(slot_columns(s, dims)) for s in slots)
    gen = torch.Generator().manual_seed(3)
    received = torch.randn(batch * width, generator=gen, requires_grad=True)
    bottom = torch.randn(batch, 4, generator=gen, requires_grad=True)
    block = DotInteraction(1 + sum(dims) // 4, 4)
    embeddings = placing.keyed(received, batch)
    assert len(embeddings.pieces().views(received)) > 2
    out = block(bottom, embeddings)
    assert any(getattr(f, "variable", None) is received for f, _ in out.grad_fn.next_functions)

    ref_received, ref_bottom = received.detach().double().requires_grad_(), bottom.detach().double().requires_grad_()
    ref = block(ref_bottom, placing.keyed(ref_received, batch).values())  # float64: the torch path
    torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=2e-5)
    grad = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (received, bottom), grad)
    want = torch.autograd.grad(ref, (ref_received, ref_bottom), grad.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=2e-5, atol=2e-5)
