"""The candidates of a retrieval head's metrics: the whole table, or at training's log steps a sample.

A table over TRAINING_CANDIDATES rows is never looked up whole at a log step:
the sampled metrics look up the sample and the window's positives only, and
equal RetrievalMetrics' sampled metrics over the drawn ids (named
`sampled_...`); two ranks holding halves of the window report what one
process does.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.retrieval.catalogue import (
    SAMPLE_SEED,
    TRAINING_CANDIDATES,
    ExactCatalogue,
    SampledCatalogue,
    training_catalogue,
)
from runtime.retrieval.head import RetrievalOutput
from runtime.retrieval.head_metrics import RetrievalHeadMetrics
from runtime.retrieval.metrics import RetrievalMetrics
from runtime.retrieval.sampling import uniform_negatives
from runtime.train.process_group import close_process_group, init_process_group
import rendezvous

ITEMS, DIM, WINDOW, SAMPLE = 5000, 8, 40, 64
METRICS = ("recall@10", "ndcg@10", "mrr")


class Table:
    """item_vectors over a fixed table, recording how many ids each call looked up."""

    def __init__(self) -> None:
        self.rows = torch.randn(ITEMS, DIM, generator=torch.Generator().manual_seed(1))
        self.looked_up: list[int] = []

    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        self.looked_up.append(ids.numel())
        return self.rows[ids]

    def item_catalogue(self) -> torch.Tensor:
        raise AssertionError("the whole catalogue was looked up")


def _window() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return torch.randn(WINDOW, DIM, generator=generator), torch.randint(0, ITEMS, (WINDOW,), generator=generator)


def _sampled_metrics(table: Table, rows: slice, group: dist.ProcessGroup | None, calls: int) -> list[dict]:
    """The head's metrics at `calls` log steps, each over the window's `rows`."""
    queries, ids = _window()
    head = RetrievalHeadMetrics(METRICS)
    catalogue = SampledCatalogue(table.item_vectors, ITEMS, SAMPLE)
    out = []
    for _ in range(calls):
        head.update(RetrievalOutput(queries[rows], table.rows[ids[rows]], ids[rows]))
        out.append(head.compute(catalogue, group))
    return out


def test_a_small_table_is_ranked_whole_and_a_large_one_against_a_sample() -> None:
    table = Table()
    whole = training_catalogue(table.item_vectors, table.item_catalogue, TRAINING_CANDIDATES)
    assert isinstance(whole.inner, ExactCatalogue) and whole.kind == "exact"
    sampled = training_catalogue(table.item_vectors, table.item_catalogue, TRAINING_CANDIDATES + 1)
    assert isinstance(sampled.inner, SampledCatalogue) and sampled.inner.size == TRAINING_CANDIDATES
    assert sampled.kind == "sampled"


@pytest.mark.parametrize("normalize", [False, True])
def test_training_ranks_positives_with_the_vectors_the_forward_used(normalize: bool) -> None:
    """An update after the forward pulled every positive onto its query: ranked against the updated
    vectors recall@1 would be 1.0; ranked as the forward saw them (random vectors) it is at chance."""
    items = 1000
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(items, DIM, generator=generator)
    queries = torch.randn(WINDOW, DIM, generator=generator)
    ids = torch.randperm(items, generator=generator)[:WINDOW]
    head = RetrievalHeadMetrics(("recall@1", "recall@10"))
    head.update(RetrievalOutput(queries, rows[ids].clone(), ids))
    updated = rows.clone()
    updated[ids] = torch.nn.functional.normalize(queries, dim=-1) * 100.0  # the step's update
    scored = (lambda r: torch.nn.functional.normalize(r, dim=-1)) if normalize else (lambda r: r)
    got = head.compute(training_catalogue(lambda i: scored(updated)[i], lambda: scored(updated), items,
                                          normalize=normalize))
    reference = RetrievalMetrics((1, 10))
    reference.update(queries, ids, scored(rows[ids]), scored(updated))
    expected = reference.compute()
    assert got == pytest.approx({"recall@1": expected["recall@1"], "recall@10": expected["recall@10"]}, rel=1e-12)
    assert got["recall@1"] <= 2 / WINDOW and got["recall@10"] <= 0.1  # chance: about 1 / 1000 and 10 / 1000
    head.update(RetrievalOutput(queries, rows[ids].clone(), ids))
    assert head.compute(ExactCatalogue(lambda: scored(updated)))["recall@1"] == 1.0  # what it measured before


def test_sampled_metrics_rank_against_the_drawn_ids_and_say_so() -> None:
    table = Table()
    first, second = _sampled_metrics(table, slice(None), None, calls=2)
    queries, ids = _window()
    for call, got in enumerate((first, second)):
        drawn = torch.unique(uniform_negatives(SAMPLE_SEED, call, SAMPLE, ITEMS))
        reference = RetrievalMetrics((10,), candidates="sampled")
        reference.update(queries, ids, table.rows[ids], table.rows[drawn], drawn)
        expected = reference.compute()
        assert list(got) == ["sampled_recall@10", "sampled_ndcg@10", "sampled_mrr"]
        assert got == pytest.approx({name: expected[name] for name in got}, rel=1e-12)
    assert first != second  # a fresh sample at every log step
    # Each log step looked up at most the sample and the window's positives, never the table.
    assert len(table.looked_up) == 2 and all(n <= SAMPLE + WINDOW for n in table.looked_up)


def test_exact_metrics_keep_their_names_and_rank_every_row() -> None:
    table = Table()
    queries, ids = _window()
    head = RetrievalHeadMetrics(METRICS)
    head.update(RetrievalOutput(queries, table.rows[ids], ids))
    got = head.compute(ExactCatalogue(lambda: table.rows))
    reference = RetrievalMetrics((10,))
    reference.update(queries, ids, table.rows[ids], table.rows)
    expected = reference.compute()
    assert got == pytest.approx({name: expected[name] for name in METRICS}, rel=1e-12)


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo", store=rendezvous.client(port, 2, datetime.timedelta(seconds=60)), rank=rank,
        world_size=2, timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    half = WINDOW // 2
    got = _sampled_metrics(Table(), slice(rank * half, (rank + 1) * half), dist.group.WORLD, calls=2)
    if rank == 0:
        torch.save(got, Path(out) / "metrics.pt")
    close_process_group()


def test_two_ranks_report_what_one_process_does(tmp_path: Path) -> None:
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2)
    got: list[dict[str, Any]] = torch.load(tmp_path / "metrics.pt")
    expected = _sampled_metrics(Table(), slice(None), None, calls=2)
    for ranks, one in zip(got, expected):
        assert ranks == pytest.approx(one, rel=1e-12)
