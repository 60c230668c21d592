"""Tests for runtime/embeddings/concurrent.py through the collection that uses it.

A collection cut into groups looked up side by side must train exactly like
the same tables looked up one group after another: the same kernels run on
the same inputs, each with one intra-op thread in both cases here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingOptimizer
from runtime.cpu import choice
from runtime.embeddings.bag_collection import EmbeddingBagCollection, _balanced_runs
from runtime.embeddings.concurrent import run_concurrently
from runtime.sparse.jagged import KeyedJaggedTensor

pytest.importorskip("fbgemm_gpu")

REPO = Path(__file__).resolve().parents[3]

BATCH = 16
TABLES = [
    EmbeddingBagConfig("t0", 50, 8, ["f0", "f1"]),
    EmbeddingBagConfig("t1", 40, 16, ["f2"]),
    EmbeddingBagConfig("t2", 30, 8, ["f3"], pooling="mean"),
    EmbeddingBagConfig("t3", 60, 4, ["f4"]),
    EmbeddingBagConfig("t4", 20, 12, ["f5"]),
]
ROWS = {"f0": 50, "f1": 50, "f2": 40, "f3": 30, "f4": 60, "f5": 20}


def _batch(seed: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (len(ROWS) * BATCH,), generator=gen)
    per_key = lengths.view(len(ROWS), BATCH).sum(1).tolist()
    values = torch.cat([torch.randint(0, n, (k,), generator=gen) for n, k in zip(ROWS.values(), per_key)])
    return KeyedJaggedTensor.from_lengths_sync(list(ROWS), values, lengths)


def _train(lookup_threads: int, torch_threads: int, steps: int = 4) -> tuple[list[torch.Tensor], dict]:
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        torch.manual_seed(0)
        collection = EmbeddingBagCollection(
            TABLES, optimizer=EmbeddingOptimizer("rowwise_adagrad", lr=0.1), lookup_threads=lookup_threads
        )
        outputs = []
        for step in range(steps):
            pooled = collection(_batch(step)).values()
            weight = torch.randn(pooled.shape, generator=torch.Generator().manual_seed(100 + step))
            (pooled * weight).sum().backward()
            outputs.append(pooled.detach())
        return outputs, collection.state_dict()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("update", ["fbgemm", "native"])
def test_side_by_side_groups_train_exactly_like_one_after_another(update: str, monkeypatch, request) -> None:
    if update == "native":
        request.getfixturevalue("native_kernels")
    monkeypatch.setenv(choice.ENV, f"embedding_update={update}")  # the same backward in every run
    concurrent_out, concurrent_state = _train(lookup_threads=3, torch_threads=3)
    sequential_out, sequential_state = _train(lookup_threads=3, torch_threads=1)
    single_out, single_state = _train(lookup_threads=1, torch_threads=1)
    for a, b, c in zip(concurrent_out, sequential_out, single_out):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert concurrent_state.keys() == single_state.keys()
    for key in single_state:
        assert torch.equal(concurrent_state[key], sequential_state[key]), key
        assert torch.equal(concurrent_state[key], single_state[key]), key


@pytest.mark.parametrize("torch_threads", [1, 2])
def test_groups_in_output_order_hand_on_their_blocks_as_parts(torch_threads: int, monkeypatch) -> None:
    """Sum tables only: the groups' blocks are the output in order, handed on unplaced; each
    block's gradient alone trains its group exactly like the one-group collection's."""
    monkeypatch.setenv(choice.ENV, "embedding_update=fbgemm")  # the same backward in every run
    tables = [t for t in TABLES if t.pooling == "sum"]
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        states = []
        for threads in (2, 1):
            torch.manual_seed(0)
            collection = EmbeddingBagCollection(
                tables, optimizer=EmbeddingOptimizer("rowwise_adagrad", lr=0.1), lookup_threads=threads
            )
            keys = collection.feature_names()
            batch = _batch(0)
            pooled = collection(batch)
            weight = torch.randn(BATCH, sum(pooled.length_per_key()), generator=torch.Generator().manual_seed(7))
            if threads == 2:
                parts = pooled.parts()
                assert [p.shape[1] for p in parts] == [8 + 8 + 16, 4 + 12]  # t0 (f0, f1) and t1 | t3 and t4
                split = weight.split([p.shape[1] for p in parts], dim=1)
                sum((p * w).sum() for p, w in zip(parts, split, strict=True)).backward()
                placed = torch.cat(parts, dim=1).detach()
            else:
                assert pooled.parts() is None
                (pooled.values() * weight).sum().backward()
                assert torch.equal(placed, pooled.values().detach()) and keys == pooled.keys()
            states.append(collection.state_dict())
    finally:
        torch.set_num_threads(before)
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_groups_are_contiguous_runs_of_about_equal_work() -> None:
    collection = EmbeddingBagCollection(TABLES, lookup_threads=3)
    # sum tables (work 16, 16, 4, 12) in three runs, then the mean table's own group
    assert [[t.name for t in g.tables] for g in collection._groups] == [["t0"], ["t1"], ["t3", "t4"], ["t2"]]
    assert [[t.name for t in run] for run in _balanced_runs(TABLES, 2)] == [["t0", "t1"], ["t2", "t3", "t4"]]
    assert _balanced_runs(TABLES[:1], 4) == [TABLES[:1]]
    assert EmbeddingBagCollection(TABLES, compute_kernel="dense", lookup_threads=3).lookup_threads == 1


def test_no_grad_lookups_and_errors_come_back_from_the_threads() -> None:
    calls = [lambda: torch.ones(2, requires_grad=True) * 2, lambda: torch.zeros(3, requires_grad=True) + 1]
    with torch.no_grad():
        results = run_concurrently(calls, threads=2)
    assert [r.requires_grad for r in results] == [False, False]
    assert torch.equal(results[0], torch.full((2,), 2.0))

    def failing() -> torch.Tensor:
        raise IndexError("feature 'f0': id 7 out of range")

    with pytest.raises(IndexError, match="id 7 out of range"):
        run_concurrently([calls[0], failing], threads=2)


def test_the_pool_runs_single_threaded_without_changing_other_threads() -> None:
    """torch.set_num_threads is partly process-wide; the pool must not leave its 1 behind."""
    script = textwrap.dedent("""
        import threading, torch
        from runtime.embeddings.concurrent import _pool, run_concurrently
        torch.set_num_threads(2)
        run_concurrently([lambda: torch.ones(3), lambda: torch.ones(2)], threads=2)
        later = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start(); thread.join()
        pool = sorted(_pool(2).submit(torch.get_num_threads).result() for _ in range(4))
        print(torch.get_num_threads(), later[0], pool)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "2 2 [1, 1, 1, 1]"
