"""Two ranks (gloo, loopback) train the sampled softmax exactly as one process on the global batch.

Each step's global batch is made from the step number; rank r takes its
slice. The ranks' losses and gradients are gathered and compared with one
process's at 1e-5: with the mean, the mean of the ranks' losses is the
global loss and each gradient, averaged over ranks as data parallelism does,
is the global gradient; with the sum (here with unequal slices, as at the end
of an epoch), losses and gradients add up.

The retrieval head's loss learns the ranks' pair counts from the candidates'
gather after its first step (gather.PaddedCounts): with slices that change
from step to step it trains what one process does, with one all-gather a
step where no rank holds more pairs than the last step's largest, and two
where one does. Every gather is an all_to_all_single of the shared-memory
exchange (runtime/process/shm_exchange.py), as the embeddings' all-to-alls.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import rendezvous
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.config.retrieval import Negatives, SampledSoftmaxConfig
from runtime.process import shm_exchange
from runtime.retrieval.gather import PaddedCounts, gather_rows_and_ids
from runtime.retrieval.head import RetrievalLoss, RetrievalOutput
from runtime.retrieval.sampled_softmax import SampledSoftmaxLoss
from runtime.train.process_group import close_process_group, init_process_group

WORLD = 2
GLOBAL_BATCH, DIM, ITEMS, STEPS = 8, 4, 12, 3
CASES: dict[str, dict[str, Any]] = {
    "both_streaming_mean": dict(
        config=SampledSoftmaxConfig(
            Negatives(in_batch=True, uniform=5),
            num_items=ITEMS,
            first_id=1,
            temperature=0.2,
            normalize=True,
            logq=True,
            frequency_slots=8,
            frequency_alpha=0.3,
            seed=4,
        ),
        slices=(4, 4),
        reduction="mean",
    ),
    "in_batch_counts_sum": dict(
        config=SampledSoftmaxConfig(Negatives(in_batch=True), num_items=ITEMS, logq=True, frequency="counts"),
        slices=(5, 3),
        reduction="sum",
    ),
    # next-item training's case: the blocked path (runtime/retrieval/blocked_softmax.py), each rank's
    # queries against the gathered global candidates
    "in_batch_blocked_sum": dict(
        config=SampledSoftmaxConfig(Negatives(in_batch=True), temperature=0.05, normalize=True),
        slices=(5, 3),
        reduction="sum",
    ),
}
COUNTS = torch.arange(ITEMS, dtype=torch.float64) * 3


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    query = torch.randn(GLOBAL_BATCH, DIM, generator=generator)
    positive = torch.randn(GLOBAL_BATCH, DIM, generator=generator)
    ids = torch.randint(1, 6, (GLOBAL_BATCH,), generator=generator)  # few ids: accidental hits across ranks
    return query, positive, ids


def _negatives(step: int, count: int) -> torch.Tensor:
    return torch.randn(count, DIM, generator=torch.Generator().manual_seed(200 + step))


def _train(case: dict[str, Any], rows: slice, group: dist.ProcessGroup | None) -> dict[str, Any]:
    """Losses and gradients of `rows` of each step, and the loss module's state at the end."""
    config = case["config"]
    loss_fn = SampledSoftmaxLoss(config, COUNTS if config.frequency == "counts" else None, group)
    steps = []
    for step in range(STEPS):
        query, positive, ids = _batch(step)
        query = query[rows].clone().requires_grad_()
        positive = positive[rows].clone().requires_grad_()
        negatives = None
        if config.negatives.uniform:
            negatives = _negatives(step, config.negatives.uniform).requires_grad_()
        loss = loss_fn(query, positive, ids[rows], negatives, reduction=case["reduction"])
        loss.backward()
        steps.append(
            {
                "loss": loss.detach(),
                "query": query.grad,
                "positive": positive.grad,
                "negatives": None if negatives is None else negatives.grad,
                "ids": loss_fn.negative_ids(),
            }
        )
    return {"steps": steps, "state": loss_fn.state_dict()}


# gather_rows_and_ids on unequal slices, rows of another dtype than the ids' (bf16, int32 near its max)
GATHER_SLICES = (4, 1)
GATHER_ROWS = torch.linspace(-3.0, 3.0, 15).reshape(5, 3).to(torch.bfloat16)
GATHER_IDS = torch.tensor([2**31 - 1, -(2**31), 7, 0, 123_456_789], dtype=torch.int32)
GATHER_WEIGHTS = torch.arange(15, dtype=torch.float32).reshape(5, 3)


def _gather(rank: int, group: dist.ProcessGroup) -> dict[str, Any]:
    start = sum(GATHER_SLICES[:rank])
    own = slice(start, start + GATHER_SLICES[rank])
    rows = GATHER_ROWS[own].clone().requires_grad_()
    gathered, ids, offset = gather_rows_and_ids(rows, GATHER_IDS[own], group)
    (gathered.float() * GATHER_WEIGHTS).sum().backward()
    return {"rows": gathered.detach(), "ids": ids, "offset": offset, "grad": rows.grad, "own": own}


def _gather_padded(rank: int, group: dist.ProcessGroup) -> dict[int, dict[str, Any]]:
    """`_gather` with the counts learnt from the gather itself, padded to PADS (0, 1: rank 0's four
    rows overflow and the gather is redone; 4: they just fit; 9: padding)."""
    start = sum(GATHER_SLICES[:rank])
    own = slice(start, start + GATHER_SLICES[rank])
    results = {}
    for pad in PADS:
        rows = GATHER_ROWS[own].clone().requires_grad_()
        counts = PaddedCounts(pad)
        gathered, ids, offset = gather_rows_and_ids(rows, GATHER_IDS[own], group, counts)
        (gathered.float() * GATHER_WEIGHTS).sum().backward()
        results[pad] = {"rows": gathered.detach(), "ids": ids, "offset": offset, "grad": rows.grad}
        results[pad]["counts"] = counts.counts
    return results


PADS = (0, 1, 4, 9)
# the retrieval loss's steps: each step's slices of HEAD_BATCHES[step] rows (step 2 overflows step 1's 5)
HEAD_SLICES = ((5, 3), (3, 5), (6, 1), (1, 1))
HEAD_CONFIG = SampledSoftmaxConfig(Negatives(in_batch=True), temperature=0.5)


def _head_batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = sum(HEAD_SLICES[step])
    generator = torch.Generator().manual_seed(300 + step)
    return (
        torch.randn(rows, DIM, generator=generator),
        torch.randn(rows, DIM, generator=generator),
        (torch.randint(1, 6, (rows,), generator=generator)),
    )


def _train_head(rank: int | None, group: dist.ProcessGroup | None) -> list[dict[str, Any]]:
    """RetrievalLoss over HEAD_SLICES' steps: rank `rank`'s slices (None: the whole batches)."""
    loss_fn = RetrievalLoss(HEAD_CONFIG, group)
    gathers, gloo_gathers = 0, 0
    original, original_gloo = shm_exchange.all_to_all_single, dist.all_gather

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal gathers
        gathers += 1
        return original(*args, **kwargs)

    def counted_gloo(*args: Any, **kwargs: Any) -> Any:
        nonlocal gloo_gathers
        gloo_gathers += 1
        return original_gloo(*args, **kwargs)

    steps = []
    for step, slices in enumerate(HEAD_SLICES):
        query, positive, ids = _head_batch(step)
        if rank is not None:
            start = sum(slices[:rank])
            own = slice(start, start + slices[rank])
            query, positive, ids = query[own], positive[own], ids[own]
        query, positive = query.clone().requires_grad_(), positive.clone().requires_grad_()
        gathers, gloo_gathers = 0, 0
        shm_exchange.all_to_all_single, dist.all_gather = counted, counted_gloo  # type: ignore[assignment]
        try:
            loss = loss_fn(RetrievalOutput(query, positive, ids), lambda _: torch.empty(0))
        finally:
            shm_exchange.all_to_all_single, dist.all_gather = original, original_gloo
        loss.backward()
        steps.append(
            {"loss": loss.detach(), "query": query.grad, "positive": positive.grad}
            | {"gathers": gathers, "gloo gathers": gloo_gathers}
            | {"largest": loss_fn.last_largest, "pairs": loss_fn.pairs_trained}
        )
    return steps


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo",
        store=rendezvous.client(port, WORLD, datetime.timedelta(seconds=60)),
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    results = {}
    for name, case in CASES.items():
        start = sum(case["slices"][:rank])
        results[name] = _train(case, slice(start, start + case["slices"][rank]), dist.group.WORLD)
    results["gather_rows_and_ids"] = _gather(rank, dist.group.WORLD)
    results["padded"] = _gather_padded(rank, dist.group.WORLD)
    results["head"] = _train_head(rank, dist.group.WORLD)
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, results)
    if rank == 0:
        torch.save(gathered, Path(out) / "ranks.pt")
    close_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ranks")
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(out)), nprocs=WORLD)
    return torch.load(out / "ranks.pt", weights_only=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_ranks_equal_one_process(ranks: list[dict[str, Any]], name: str) -> None:
    case = CASES[name]
    one = _train(case, slice(None), None)
    scale = WORLD if case["reduction"] == "mean" else 1  # the data-parallel average divides by it
    per_rank = [r[name]["steps"] for r in ranks]
    for step, expected in enumerate(one["steps"]):
        got = [steps[step] for steps in per_rank]
        losses = torch.stack([g["loss"] for g in got])
        total = losses.mean() if case["reduction"] == "mean" else losses.sum()
        torch.testing.assert_close(total, expected["loss"], rtol=1e-5, atol=1e-5)
        for key in ("query", "positive"):
            joined = torch.cat([g[key] for g in got]) / scale
            torch.testing.assert_close(joined, expected[key], rtol=1e-5, atol=1e-5)
        if expected["negatives"] is not None:
            summed = sum(g["negatives"] for g in got) / scale
            torch.testing.assert_close(summed, expected["negatives"], rtol=1e-5, atol=1e-5)
            assert all(torch.equal(g["ids"], expected["ids"]) for g in got)
    for rank in ranks:
        for key, value in one["state"].items():
            assert torch.equal(rank[name]["state"][key], value), key


def test_rows_and_ids_are_gathered_in_one_exchange(ranks: list[dict[str, Any]]) -> None:
    """Every rank gets all rows and ids in rank order, bit for bit; each rank's row gradient is the
    sum of every rank's gradient of the gathered rows (here each rank's is GATHER_WEIGHTS)."""
    for rank, result in enumerate(r["gather_rows_and_ids"] for r in ranks):
        assert torch.equal(result["rows"], GATHER_ROWS) and result["rows"].dtype == torch.bfloat16
        assert torch.equal(result["ids"], GATHER_IDS) and result["ids"].dtype == torch.int32
        assert result["offset"] == sum(GATHER_SLICES[:rank])
        assert torch.equal(result["grad"].float(), WORLD * GATHER_WEIGHTS[result["own"]])


@pytest.mark.parametrize("pad", PADS)
def test_the_gather_learns_the_counts_padded_or_redone(ranks: list[dict[str, Any]], pad: int) -> None:
    """Padded to any size, with a redo where a rank overflows it, the gather gives what the counted
    one gives, bit for bit, and every rank's count."""
    for result in ranks:
        padded, plain = result["padded"][pad], result["gather_rows_and_ids"]
        assert padded["counts"] == list(GATHER_SLICES)
        assert torch.equal(padded["rows"], plain["rows"]) and torch.equal(padded["ids"], plain["ids"])
        assert padded["offset"] == plain["offset"] and torch.equal(padded["grad"], plain["grad"])


def test_the_head_learns_the_counts_from_the_gather(ranks: list[dict[str, Any]]) -> None:
    """Two ranks' retrieval loss, its counts learnt from the candidates' gather, trains what one
    process does, with one all-gather a step except the first (the counts exchanged) and where a
    rank holds more pairs than the last step's largest (the gather redone)."""
    one = _train_head(None, None)
    for step, expected in enumerate(one):
        got = [r["head"][step] for r in ranks]
        torch.testing.assert_close(torch.stack([g["loss"] for g in got]).mean(), expected["loss"], rtol=1e-5, atol=1e-5)
        for key in ("query", "positive"):
            joined = torch.cat([g[key] for g in got]) / WORLD
            torch.testing.assert_close(joined, expected[key], rtol=1e-5, atol=1e-5)
        assert [g["largest"] for g in got] == [max(HEAD_SLICES[step])] * WORLD
        assert [g["pairs"] for g in got] == [expected["pairs"]] * WORLD
    assert [r["head"][step]["gathers"] for step in range(len(HEAD_SLICES)) for r in ranks[:1]] == [2, 1, 2, 1]
    # every gather is an all-to-all of the shared-memory exchange, none gloo's own all-gather
    assert [r["head"][step]["gloo gathers"] for step in range(len(HEAD_SLICES)) for r in ranks] == [0] * 8
