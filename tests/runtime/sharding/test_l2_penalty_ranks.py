"""The `embedding_l2` penalty on 2 ranks (gloo, CPU) trains exactly like one process on the global batch.

The mixed plan of sharded_cases (t0 data_parallel, t1 table_wise, t2
column_wise, t3 table_row_wise, t4 row_wise on the dense kernel; mean
pooling, a table two features read), with sgd on weighted ids and with
rowwise_adagrad, and the mixed plan of sequence_cases' sequence tables (row_wise,
column_wise on the dense kernel, data_parallel, table_wise) with rowwise_adagrad,
every table's optimizer with `embedding_l2`: a sharded table's rows are
penalised where they live, a replica's once, so the tables after the steps,
the losses, and the logged loss with the penalty (`SparseArch.logged_penalty`,
whose mean over ranks is the whole penalty) equal one process's. The one process's penalty and update are tested
against their formula in tests/runtime/embeddings/test_l2_penalty.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import rendezvous
import sequence_cases as qc
import sharded_cases as sc
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from runtime.sharding import distribute_dense
from runtime.train.process_group import close_process_group

L2 = 0.2
CASES = [c for c in sc.cases() if c.name.startswith("mixed-")]
SEQUENCE_CASE = next(c for c in qc.cases() if c.name == "mixed-rowwise_adagrad")


def penalise(patch: Callable[[object, str, object], None] = setattr) -> None:
    """Every case's optimizer with the penalty: set for good in each spawned rank, through
    monkeypatch.setattr in the test process (whose later test files build the cases unpenalised)."""
    for cases in (sc, qc):
        patch(cases, "OPTIMIZERS", {name: replace(o, embedding_l2=L2) for name, o in cases.OPTIMIZERS.items()})


def train(model: Any, group: dist.ProcessGroup | None, rank: int, world_size: int) -> list[list[float]]:
    """sc.train's (or qc.train's) steps; per step the global mean loss and the logged loss (with the penalty)."""
    cases = qc if isinstance(model, qc.SequenceModel) else sc
    optimizer = torch.optim.SGD(model.dense_parameters(), lr=0.1)
    trained = distribute_dense(model, group)
    out = []
    for step in range(cases.STEPS):
        dense, sparse, labels = cases.make_batch(step, rank, world_size)
        loss = F.binary_cross_entropy_with_logits(trained(dense, sparse), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        penalty = model.sparse_arch.logged_penalty()
        assert penalty is not None
        total = torch.stack([loss.detach(), loss.detach() + penalty])
        if group is not None:
            dist.all_reduce(total, group=group)
        out.append((total / world_size).tolist())
    return out


def run(rank: int, port: int, out: str) -> None:
    penalise()
    group = sc.init(rank, port)
    results = {}
    for case in CASES:
        model = sc.build(case, group, sc.WORLD_SIZE)
        results[case.name] = {"losses": train(model, group, rank, sc.WORLD_SIZE)}
        results[case.name]["tables"] = model.sparse_arch.full_state_dict()
    model = qc.build(SEQUENCE_CASE, group, sc.WORLD_SIZE)
    results["sequences"] = {"losses": train(model, group, rank, sc.WORLD_SIZE)}
    results["sequences"]["tables"] = model.sparse_arch.full_state_dict()
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    del model, group
    close_process_group()


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("l2_ranks")
    with rendezvous.hosted_store() as port:
        mp.spawn(run, args=(port, str(out)), nprocs=sc.WORLD_SIZE)
    return torch.load(Path(out) / "results.pt")


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_two_ranks_penalise_like_one_process(
    distributed: dict[str, Any], case: sc.Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    penalise(monkeypatch.setattr)
    model, tables_of = sc.reference(case)
    expected = train(model, None, rank=0, world_size=1)
    got = distributed[case.name]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(expected), rtol=1e-5, atol=0)
    penalties = [logged - loss for loss, logged in expected]
    assert min(penalties) > 1e-3  # the penalty is part of the logged figure
    for name, table in tables_of(model).items():
        torch.testing.assert_close(got["tables"][name], table, rtol=0, atol=1e-5)
    # and it changed the training: the same case without the penalty ends elsewhere
    monkeypatch.setattr(sc, "OPTIMIZERS", {k: replace(o, embedding_l2=0.0) for k, o in sc.OPTIMIZERS.items()})
    plain, plain_tables = sc.reference(case)
    sc.train(plain, None, rank=0, world_size=1)
    assert any((plain_tables(plain)[n] - t).abs().max() > 1e-3 for n, t in tables_of(model).items())


def test_two_ranks_penalise_sequence_tables_like_one_process(
    distributed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    penalise(monkeypatch.setattr)
    model, tables_of = qc.reference(SEQUENCE_CASE)
    expected = train(model, None, rank=0, world_size=1)
    got = distributed["sequences"]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(expected), rtol=1e-5, atol=0)
    assert min(logged - loss for loss, logged in expected) > 1e-3
    for name, table in tables_of(model).items():
        torch.testing.assert_close(got["tables"][name], table, rtol=0, atol=1e-5)
