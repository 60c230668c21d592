"""A compiled spec with BatchNorm and dropout on trains on 2 ranks exactly what one process trains.

The generated module wires the process group into the MLPs' SyncBatchNorm
(statistics of the global batch) and KeyedDropout (masks keyed by the
global sample index and the step): after STEPS adam steps of 64 samples,
2 ranks over gloo (32 samples each) and one process hold the same losses,
dense parameters, running statistics and tables, to 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import norm_dropout_ranks as nd
import rendezvous

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("norm_dropout")
    modules = nd.cc.compile_modules(out, (1, 2), nd.SPEC)
    with rendezvous.hosted_store() as port:
        mp.spawn(nd.run, args=(port, str(modules[2]), str(out)), nprocs=2)
    return {"one": nd.train_run(str(modules[1])), "two": torch.load(out / "results.pt")}


def test_the_modules_hold_batch_norm_and_dropout(runs: dict[str, Any]) -> None:
    state = runs["one"]["state"]
    assert {"bottom.norms.0.running_var", "top.norms.1.running_mean"} <= set(state)
    assert int(state["top.dropouts.1.step"]) == nd.STEPS
    assert int(state["bottom.norms.0.num_batches_tracked"]) == nd.STEPS


def test_two_ranks_train_what_one_process_trains(runs: dict[str, Any]) -> None:
    one, two = runs["one"], runs["two"]
    torch.testing.assert_close(torch.tensor(two["losses"]), torch.tensor(one["losses"]), **TOL)
    assert set(two["state"]) == set(one["state"])
    for name, value in one["state"].items():
        torch.testing.assert_close(two["state"][name], value, **TOL, msg=name)
