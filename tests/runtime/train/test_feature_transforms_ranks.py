"""Two ranks train a spec with fanned-out ids, bucketized columns and position weights like one process.

The spec (tests/specs/valid/feature_transforms.yaml) puts the position-weighted table on row_wise, a
wide table reading another feature's ids on data_parallel and its source on row_wise. Both ranks
train 6 synthetic global batches of 16 with the plain loop and with the pipeline; the mean of their
losses, the full tables and the dense state (the position weights among them) must equal one
process's to 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import feature_transforms_cases as fc
import pipeline_cases as pc
from compiler.pipeline import Options, generate
from runtime.train.worker import load_module
import rendezvous

SPEC = Path(__file__).resolve().parents[2] / "specs" / "valid" / "feature_transforms.yaml"
ATOL = 1e-5


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    out = tmp_path_factory.mktemp("feature_transforms")
    return {n: generate(str(SPEC), Options(world_size=n)).write(out / f"ws{n}")[0] for n in (1, 2)}


@pytest.fixture(scope="module")
def two_ranks(compiled: dict[int, Path]) -> dict[str, Any]:
    out = compiled[2].parent
    with rendezvous.hosted_store() as port:
        mp.spawn(fc.run_ranks, args=(port, str(compiled[2]), str(out)), nprocs=2)
    return torch.load(out / "results.pt")


@pytest.mark.parametrize("mode", ["plain", "depth2"])
def test_two_ranks_train_like_one_process(compiled: dict[int, Path], two_ranks: dict[str, Any], mode: str) -> None:
    one = pc.train_case(load_module(str(compiled[1])), None, 0, 1, None)
    got = two_ranks[mode]
    torch.testing.assert_close(got["losses"], one["losses"], rtol=0, atol=ATOL)
    assert got["tables"].keys() == one["tables"].keys()
    for name, table in one["tables"].items():
        torch.testing.assert_close(got["tables"][name], table, rtol=0, atol=ATOL, msg=name)
    assert got["dense"].keys() == one["dense"].keys()
    for name, value in one["dense"].items():
        torch.testing.assert_close(got["dense"][name], value, rtol=0, atol=ATOL, msg=name)
    weights = one["dense"]["_position_weights.tags.weight"]
    assert (weights - 1).abs().max() > 1e-3  # the position weights trained
