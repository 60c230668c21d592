"""Sequence tables in checkpoints: saved at two ranks, loaded at one, and the reverse.

The mixed plan (row_wise, column_wise, data_parallel and table_wise sequence
tables beside a bag table) with Adam, whose per-element state reshards
exactly. One process trains SAVED_AT steps, saves, and goes on; a spawned
two-rank job does the same, and also resumes the one-process checkpoint.
Each resumed run must load the tables its checkpoint holds and continue
with the losses of the uninterrupted run (1e-5), at the other world size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import sequence_cases as qc
import sharded_cases as sc
import rendezvous

RTOL_LOSS = 1e-5
ATOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sequence_checkpoints")
    model = qc.build(qc.case_named(qc.RESUME_CASE), None, 1)
    qc.train(model, None, 0, 1, range(qc.SAVED_AT))
    qc.save(model, str(out / "ws1"), None, 1)
    saved = qc.tables_of(model)
    after = qc.train(model, None, 0, 1, range(qc.SAVED_AT, qc.STEPS))
    with rendezvous.hosted_store() as port:
        mp.spawn(qc.run_checkpoints, args=(port, str(out), str(out / "ws1")), nprocs=qc.WORLD_SIZE)
    return {
        "out": out,
        "one": {"saved": saved, "after": after, "tables": qc.tables_of(model)},
        "two": torch.load(Path(out) / "checkpoints.pt"),
    }


def assert_losses_close(got: list[float], expected: list[float]) -> None:
    relative = max(abs(a - b) / abs(b) for a, b in zip(got, expected))
    assert relative <= RTOL_LOSS, f"losses {got} vs {expected}"


def assert_tables_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, table in expected.items():
        torch.testing.assert_close(got[name], table, rtol=0, atol=ATOL)


def test_two_ranks_train_like_one_process_up_to_the_save(runs: dict[str, Any]) -> None:
    assert_tables_close(runs["two"]["saved"], runs["one"]["saved"])
    assert_losses_close(runs["two"]["after"], runs["one"]["after"])


def test_a_two_rank_checkpoint_resumes_in_one_process(runs: dict[str, Any]) -> None:
    model = qc.resume(str(runs["out"] / "ws2"), None, 0, 1)
    for name, table in runs["two"]["saved"].items():
        assert torch.equal(qc.tables_of(model)[name], table), name
    losses = qc.train(model, None, 0, 1, range(qc.SAVED_AT, qc.STEPS))
    assert_losses_close(losses, runs["one"]["after"])
    assert_tables_close(qc.tables_of(model), runs["one"]["tables"])


def test_a_one_process_checkpoint_resumes_on_two_ranks(runs: dict[str, Any]) -> None:
    for name, table in runs["one"]["saved"].items():
        assert torch.equal(runs["two"]["loaded_from_one"][name], table), name
    assert_losses_close(runs["two"]["resumed_losses"], runs["one"]["after"])
    assert_tables_close(runs["two"]["resumed_tables"], runs["one"]["tables"])
