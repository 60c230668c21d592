"""`training.lr_plateau` at two ranks: both take one process's decisions on the global batch.

Each rank scores its half of every evaluation pass; the metrics are
all-reduced (runtime.reporting.metrics) before its own plateau sees them, so
both ranks cut the rates at the same passes, by the same factor, as one
process scoring the whole pass does (runtime.train.lr_plateau).
"""

from __future__ import annotations

from pathlib import Path

import plateau_ranks as pr
import pytest
import rendezvous
import torch
import torch.multiprocessing as mp


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[list[tuple[dict, float]]]:
    out = tmp_path_factory.mktemp("plateau_ranks")
    with rendezvous.hosted_store() as port:
        mp.spawn(pr.run, args=(port, str(out)), nprocs=pr.WORLD_SIZE)
    return [torch.load(Path(out) / f"rank{rank}.pt") for rank in range(pr.WORLD_SIZE)]


def test_both_ranks_cut_the_rates_where_one_process_does(ranks: list[list[tuple[dict, float]]]) -> None:
    one = pr.decisions(0, 1, None)
    factors = [factor for _, factor in one]
    # One process's decisions are torch's ReduceLROnPlateau's on the same AUCs, and the passes do cut.
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    reference = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=1)
    expected = []
    for metrics, _ in one:
        reference.step(metrics["click"]["auc"])
        expected.append(optimizer.param_groups[0]["lr"])
    assert factors == expected and min(factors) < 1.0
    for seen in ranks:
        assert [factor for _, factor in seen] == factors
        for (metrics, _), (expected, _) in zip(seen, one, strict=True):
            assert metrics["click"]["auc"] == pytest.approx(expected["click"]["auc"], abs=1e-6)
