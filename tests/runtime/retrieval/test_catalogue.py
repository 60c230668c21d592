"""The candidates of a retrieval head's metrics: the whole table in evaluation, each step's own in training.

Training ranks each step's held-out positives against the step's shared
uniform negatives and (with in-batch negatives) the global batch's held-out
positives, all with the vectors the step's forward computed: an update after
the forward changes nothing, the figures equal RetrievalMetrics over those
candidates (named `sampled_...`), and two ranks holding halves of each batch
report what one process does. The steps are kept and ranked together (one
exchange across ranks for all of them) at the log step, or every
`kept_steps` steps of a longer window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import rendezvous
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from runtime.config.retrieval import Negatives, SampledSoftmaxConfig
from runtime.process import shm_exchange
from runtime.retrieval.catalogue import ExactCatalogue, StepCandidates
from runtime.retrieval.head import RetrievalLoss, RetrievalOutput
from runtime.retrieval.head_metrics import KEPT_STEPS, RetrievalHeadMetrics
from runtime.retrieval.metrics import RetrievalMetrics
from runtime.train.process_group import close_process_group

ITEMS, DIM, BATCH, NEGATIVES, STEPS = 1000, 8, 40, 30, 3
METRICS = ("recall@10", "ndcg@10", "mrr")


def _loss(negatives: str, normalize: bool = False, group: dist.ProcessGroup | None = None) -> RetrievalLoss:
    kinds = Negatives(in_batch=negatives != "uniform", uniform=NEGATIVES if negatives != "in_batch" else 0)
    config = SampledSoftmaxConfig(kinds, num_items=ITEMS, normalize=normalize)
    return RetrievalLoss(config, group)


def _steps() -> list[dict[str, torch.Tensor]]:
    """Each step's queries, positive ids and vectors, and shared negatives as a forward would compute them."""
    generator = torch.Generator().manual_seed(2)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, ITEMS, (BATCH,), generator=generator)
        ids[1] = ids[0]  # a repeated positive: one candidate
        negative_ids = torch.randint(0, ITEMS, (NEGATIVES,), generator=generator)
        negative_ids[:2] = ids[:2]  # accidental hits
        out.append(
            {
                "queries": torch.randn(BATCH, DIM, generator=generator),
                "ids": ids,
                "positives": torch.randn(ITEMS, DIM, generator=generator)[ids],
                "negative_ids": negative_ids,
                "negatives": torch.randn(NEGATIVES, DIM, generator=generator),
            }
        )
    for step in out:  # one item, one vector within a step
        step["positives"][1] = step["positives"][0]
    return out


def _train_window(
    loss: RetrievalLoss, rows: slice, group: dist.ProcessGroup | None, kept_steps: int = KEPT_STEPS
) -> tuple[dict[str, Any], list[int]]:
    """The window's figures, and after each step the number of steps kept and not ranked yet."""
    head = RetrievalHeadMetrics(METRICS, mask_seen=False, kept_steps=kept_steps)
    step_candidates = StepCandidates(loss)
    kept = []
    for step in _steps():
        if loss.softmax.config.negatives.uniform:
            loss.step_negatives = (step["negative_ids"], step["negatives"])
        output = RetrievalOutput(step["queries"][rows], step["positives"][rows].clone(), step["ids"][rows])
        head.update(output, step=step_candidates)
        output.positive.mul_(0).add_(output.query * 100)  # the update after the forward: ranking must not see it
        kept.append(len(head.kept))
    return head.compute(step_candidates, group), kept


def _reference(negatives: str, normalize: bool) -> dict[str, float | None]:
    """RetrievalMetrics over each step's candidates: the batch's positives and/or its negatives."""
    scored = (lambda rows: F.normalize(rows, dim=-1)) if normalize else (lambda rows: rows)
    reference = RetrievalMetrics((10,), candidates="sampled")
    for step in _steps():
        vectors, ids = [], []
        if negatives != "uniform":
            vectors.append(scored(step["positives"]))
            ids.append(step["ids"])
        if negatives != "in_batch":
            vectors.append(step["negatives"])
            ids.append(step["negative_ids"])
        candidate_ids, first = _first(torch.cat(ids))
        reference.update(
            step["queries"], step["ids"], scored(step["positives"]), torch.cat(vectors)[first], candidate_ids
        )
    return reference.compute()


def _first(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct ids and the index of each one's first occurrence, by a plain loop."""
    seen: dict[int, int] = {}
    for index, value in enumerate(ids.tolist()):
        seen.setdefault(value, index)
    distinct = sorted(seen)
    return torch.tensor(distinct), torch.tensor([seen[value] for value in distinct])


@pytest.mark.parametrize("negatives", ["in_batch", "uniform", "both"])
@pytest.mark.parametrize("normalize", [False, True])
def test_training_ranks_each_step_against_its_forward_candidates(negatives: str, normalize: bool) -> None:
    got, kept = _train_window(_loss(negatives, normalize), slice(None), None)
    assert kept == [1, 2, 3]  # a window of three steps: all kept, ranked at its end
    expected = _reference(negatives, normalize)
    assert list(got) == ["sampled_recall@10", "sampled_ndcg@10", "sampled_mrr"]
    assert got == pytest.approx({name: expected[name] for name in got}, rel=1e-12)
    # Random vectors: at chance, about 10 / candidates (the candidates of a step number 40 to 70).
    assert got["sampled_recall@10"] < 0.4


@pytest.mark.parametrize("negatives", ["in_batch", "both"])
def test_a_longer_window_ranks_every_kept_steps_steps(negatives: str) -> None:
    got, kept = _train_window(_loss(negatives, True), slice(None), None, kept_steps=2)
    assert kept == [1, 0, 1]  # the first two steps ranked once the second is kept
    expected = _reference(negatives, True)
    assert got == pytest.approx({name: expected[name] for name in got}, rel=1e-12)


def test_the_loss_keeps_the_shared_negatives_of_its_last_training_forward() -> None:
    loss = _loss("both")
    table = torch.randn(ITEMS, DIM)
    output = RetrievalOutput(torch.randn(4, DIM), table[:4], torch.arange(4))
    loss(output, lambda ids: table[ids])
    ids, vectors = loss.step_negatives  # type: ignore[misc]
    assert ids.shape == (NEGATIVES,)
    torch.testing.assert_close(vectors, table[ids], rtol=0, atol=0)
    loss.eval()
    loss(output, lambda ids: table[ids] * 2)  # evaluation leaves them alone
    torch.testing.assert_close(loss.step_negatives[1], table[ids], rtol=0, atol=0)  # type: ignore[index]


def test_exact_metrics_keep_their_names_and_rank_every_row() -> None:
    generator = torch.Generator().manual_seed(1)
    rows, queries = torch.randn(ITEMS, DIM, generator=generator), torch.randn(BATCH, DIM, generator=generator)
    ids = torch.randint(0, ITEMS, (BATCH,), generator=generator)
    head = RetrievalHeadMetrics(METRICS)
    head.update(RetrievalOutput(queries, rows[ids], ids))
    got = head.compute(ExactCatalogue(lambda: rows))
    reference = RetrievalMetrics((10,))
    reference.update(queries, ids, rows[ids], rows)
    expected = reference.compute()
    assert got == pytest.approx({name: expected[name] for name in METRICS}, rel=1e-12)


def _rank(rank: int, port: int, out: str, kept_steps: int) -> None:
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
    # all-gathers (all-to-alls of the shared-memory exchange), by the step that made them
    # (1-based; STEPS + 1: the log step)
    gathers = []
    all_gather, made = shm_exchange.all_to_all_single, [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        gathers.append(made[0] + 1)
        return all_gather(*args, **kwargs)

    shm_exchange.all_to_all_single = counted
    loss = _loss("both", True, dist.group.WORLD)
    original = RetrievalHeadMetrics.update

    def update(self: RetrievalHeadMetrics, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made[0] += 1

    RetrievalHeadMetrics.update = update  # type: ignore[method-assign]
    try:
        half = BATCH // 2
        got, _ = _train_window(loss, slice(rank * half, (rank + 1) * half), dist.group.WORLD, kept_steps)
    finally:
        shm_exchange.all_to_all_single, RetrievalHeadMetrics.update = all_gather, original  # type: ignore[method-assign]
    if rank == 0:
        torch.save((got, gathers), Path(out) / "metrics.pt")
    close_process_group()


@pytest.mark.parametrize("kept_steps", [KEPT_STEPS, 2])
def test_two_ranks_report_what_one_process_does(tmp_path: Path, kept_steps: int) -> None:
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(tmp_path), kept_steps), nprocs=2)
    got, gathers = torch.load(tmp_path / "metrics.pt")
    expected = _reference("both", True)
    assert got == pytest.approx({name: expected[name] for name in got}, rel=1e-12)
    # One exchange per window of kept steps (each step's counts, the rows, the ids), none per step.
    assert gathers == ([STEPS + 1] * 3 if kept_steps == KEPT_STEPS else [2] * 3 + [STEPS + 1] * 3)
