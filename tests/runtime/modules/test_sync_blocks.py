"""Two ranks (gloo, CPU) with BatchNorm, dropout and Dice on compute exactly what one process computes.

An MLP with norm "batch" (SyncBatchNorm), dropout (KeyedDropout), Dice
(its own SyncBatchNorm statistics) and residuals trains 3 SGD steps on 2 ranks under DDP, each rank's loss the mean
over its half of the global batch, and in one process on the global batch:
outputs, parameter gradients (DDP's average), running statistics and the
trained parameters agree to 1e-5; the input gradients are the one process's
times the world size (each rank's loss is a mean over half the samples). A
forward-only run over slices of 5 and 3 samples (dropout finding its first
sample by an all-gather) agrees with one process too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import sync_blocks_ranks as sr
import rendezvous

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sync_blocks")
    with rendezvous.hosted_store() as port:
        mp.spawn(sr.run, args=(port, str(out)), nprocs=sr.WORLD_SIZE)
    return torch.load(Path(out) / "results.pt")


def test_two_ranks_train_like_one_process(distributed: dict[str, Any]) -> None:
    got, expected = distributed["train"], sr.train(sr.make_model(None), rank=0, world_size=1)
    for step in range(sr.STEPS):
        torch.testing.assert_close(got["outputs"][step], expected["outputs"][step], **TOL)
        torch.testing.assert_close(got["input_grads"][step], expected["input_grads"][step] * sr.WORLD_SIZE, **TOL)
        for name, grad in expected["grads"][step].items():
            torch.testing.assert_close(got["grads"][step][name], grad, **TOL, msg=f"step {step}: {name}")
    assert any("running_var" in name for name in got["state"])
    assert any(name.startswith("parametric.") and name.endswith("running_var") for name in got["state"])
    for name, value in expected["state"].items():
        torch.testing.assert_close(got["state"][name], value, **TOL, msg=name)


def test_both_ranks_hold_the_same_gradients_and_statistics(distributed: dict[str, Any]) -> None:
    rank0, rank1 = distributed["train"], distributed["rank1"]
    for name, value in rank0["state"].items():
        torch.testing.assert_close(rank1["state"][name], value, rtol=0, atol=0, msg=name)
    for step in range(sr.STEPS):
        for name, grad in rank0["grads"][step].items():
            torch.testing.assert_close(rank1["grads"][step][name], grad, rtol=0, atol=0)


def test_uneven_slices_forward_like_one_process(distributed: dict[str, Any]) -> None:
    got, expected = distributed["uneven"], sr.forward_uneven(sr.make_model(None), rank=0, world_size=1)
    for step in range(2):
        torch.testing.assert_close(got["outputs"][step], expected["outputs"][step], **TOL)
    for name, value in expected["state"].items():
        torch.testing.assert_close(got["state"][name], value, **TOL, msg=name)
