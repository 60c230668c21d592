"""`training.lr_plateau` at two ranks: both take one process's decisions on the global batch.

Each rank scores its half of every evaluation pass; the metrics are
all-reduced (runtime.reporting.metrics) before its own plateau sees them, so
both ranks cut the rates at the same passes, by the same factor, as one
process scoring the whole pass does (runtime.train.lr_plateau). Ranks whose
own figures for a pass differ (rounding) still decide alike, as rank 0 does
alone: the monitor hands every rank's callbacks rank 0's figures
(runtime.reporting.metrics.agreed), so early stopping ends every rank at the
same step.
"""

from __future__ import annotations

from pathlib import Path

import plateau_ranks as pr
import pytest
import rendezvous
import torch
import torch.multiprocessing as mp


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plateau_ranks")
    with rendezvous.hosted_store() as port:
        mp.spawn(pr.run, args=(port, str(out)), nprocs=pr.WORLD_SIZE)
    return out


@pytest.fixture(scope="module")
def ranks(out: Path) -> list[list[tuple[dict, float]]]:
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


def test_ranks_whose_figures_differ_take_rank_0s_decisions_and_stop_together(out: Path) -> None:
    alone = [pr.stops(rank, None) for rank in range(pr.WORLD_SIZE)]
    # Alone, the two ranks' figures would end training a pass apart: one would wait for the other forever.
    assert alone[0]["stopped_at"] == 3 and alone[1]["stopped_at"] == 4
    assert alone[0]["tracker"]["step"] == 1 and alone[1]["tracker"]["step"] == 2
    for rank in range(pr.WORLD_SIZE):
        assert torch.load(out / f"stops{rank}.pt") == alone[0], rank
