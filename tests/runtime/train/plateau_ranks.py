"""Rank code of test_lr_plateau_ranks.py: each rank scores its half of every evaluation pass and feeds the
all-reduced metrics to its own reduce-on-plateau; and ranks whose own figures differ (`own_auc`) decide
through the training monitor, which hands its callbacks rank 0's."""

from __future__ import annotations

import datetime
from pathlib import Path

import rendezvous
import torch
import torch.distributed as dist

from runtime.modules.heads.losses import HeadConfig
from runtime.reporting.metrics import MetricSet
from runtime.reporting.monitor import Evaluation, TrainingMonitor
from runtime.train.early_stopping import BestMetric, EarlyStopping
from runtime.train.lr_plateau import LrPlateau
from runtime.train.process_group import close_process_group, init_process_group

WORLD_SIZE, ROWS = 2, 512
HEAD = HeadConfig("click", "bce", "click")
SIGNAL = (0.5, 1.0, 0.9, 0.95, 1.1, 0.7, 0.6, 0.65)  # how well each pass's scores separate the labels


def evaluation_pass(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of pass `index`: logits and 0/1 labels."""
    generator = torch.Generator().manual_seed(index)
    labels = (torch.rand(ROWS, generator=generator) < 0.3).float()
    logits = SIGNAL[index] * (2 * labels - 1) + torch.randn(ROWS, generator=generator)
    return logits, labels


def decisions(rank: int, world_size: int, group: dist.ProcessGroup | None) -> list[tuple[dict, float]]:
    """(the metrics the plateau saw, its factor after them) for every pass, scoring rank `rank`'s rows."""
    plateau = LrPlateau(BestMetric("click", "auc"), factor=0.5, patience=1)
    seen = []
    share = ROWS // world_size
    for index in range(len(SIGNAL)):
        logits, labels = evaluation_pass(index)
        rows = slice(rank * share, (rank + 1) * share)
        metrics = MetricSet([HEAD])
        metrics.update({"click": logits[rows]}, {"click": labels[rows]})
        values = metrics.compute(group)
        seen.append((values, plateau.observe(values, step=index)))
    return seen


# An AUC per pass that rank 1 computes 1e-6 higher at pass 2, as a rank whose rounding differed would:
# rank 0 sees a tie with the best (no gain), rank 1 a new best, so alone they would stop a pass apart.
AUCS, PATIENCE = (0.70, 0.75, 0.75, 0.74, 0.73, 0.72, 0.71), 2


def own_auc(rank: int, index: int) -> float:
    return AUCS[index] + (1e-6 if rank == 1 and index == 2 else 0.0)


def stops(rank: int, group: dist.ProcessGroup | None) -> dict:
    """Evaluation passes through the monitor, to early stopping and a plateau, until early stopping says stop."""
    tracker = EarlyStopping(BestMetric("click", "auc"), PATIENCE)
    plateau = LrPlateau(BestMetric("click", "auc"), factor=0.5, patience=1)
    factors = []

    def decide(step: int, metrics: dict) -> None:
        tracker.observe(step, metrics)
        factors.append(plateau.observe(metrics, step=step))

    passes = iter(range(len(AUCS)))
    monitor = TrainingMonitor(
        [HEAD],
        steps=len(AUCS),
        log_every=1,
        global_batch_size=ROWS,
        process_group=group,
        evaluation=lambda: Evaluation({"click": {"auc": own_auc(rank, next(passes))}}),
        eval_every=1,
        on_evaluation=decide,
    )
    for step in range(len(AUCS)):
        monitor.evaluate(step)
        if tracker.should_stop():
            break
    return {"stopped_at": step, "tracker": tracker.state_dict(), "factors": factors}


def run(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo",
        store=rendezvous.client(port, WORLD_SIZE, datetime.timedelta(seconds=60)),
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=60),
    )
    torch.save(decisions(rank, WORLD_SIZE, dist.group.WORLD), Path(out) / f"rank{rank}.pt")
    torch.save(stops(rank, dist.group.WORLD), Path(out) / f"stops{rank}.pt")
    close_process_group()
