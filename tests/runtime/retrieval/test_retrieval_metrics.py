"""Retrieval metrics against brute force: every candidate scored, sorted, the formulas in Python."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.reporting.console import format_metrics
from runtime.retrieval.metrics import RetrievalMetrics, metric_names
from runtime.train.process_group import close_process_group
import rendezvous

KS = (1, 5, 20)


def _brute_force(
    queries: np.ndarray,
    positive_ids: np.ndarray,
    positives: np.ndarray,
    candidates: np.ndarray,
    candidate_ids: np.ndarray,
    ks: tuple[int, ...],
) -> dict[str, float]:
    """Mean over queries with positives; a positive sorts after every candidate with its score."""
    sums: dict[str, float] = {}
    queries_counted = 0
    for query, ids, embeddings in zip(queries, positive_ids, positives):
        relevant = [(int(i), e) for i, e in zip(ids, embeddings) if i >= 0]
        if not relevant:
            continue
        queries_counted += 1
        wanted = {i for i, _ in relevant}
        ranked = [(float(query @ c), 0) for c, i in zip(candidates, candidate_ids) if int(i) not in wanted]
        ranked += [(float(query @ e), 1) for _, e in relevant]
        ranked.sort(key=lambda item: (-item[0], item[1]))
        positions = [p for p, (_, is_positive) in enumerate(ranked) if is_positive]
        for k in ks:
            inside = [p for p in positions if p < k]
            ideal = sum(1 / math.log2(p + 2) for p in range(min(len(relevant), k)))
            values = {
                f"recall@{k}": len(inside) / len(relevant),
                f"ndcg@{k}": sum(1 / math.log2(p + 2) for p in inside) / ideal,
                f"hit_rate@{k}": float(bool(inside)),
            }
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + value
        sums["mrr"] = sums.get("mrr", 0.0) + 1 / (positions[0] + 1)
    return {name: value / queries_counted for name, value in sums.items()}


def _table(items: int = 300, dim: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randn(items, dim, generator=torch.Generator().manual_seed(seed))


def _queries(count: int, table: torch.Tensor, seed: int) -> torch.Tensor:
    """Queries near some items, so positives land at every depth of the ranking."""
    generator = torch.Generator().manual_seed(seed)
    near = table[torch.randint(0, table.shape[0], (count,), generator=generator)]
    return near + 1.5 * torch.randn(near.shape, generator=generator)


def test_exact_metrics_over_a_whole_table_in_chunks() -> None:
    table = _table()
    queries = _queries(40, table, 1)
    positive_ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(2))
    metrics = RetrievalMetrics(KS, chunk_size=37)
    metrics.update(queries[:25], positive_ids[:25], table[positive_ids[:25]], table)
    metrics.update(queries[25:], positive_ids[25:], table[positive_ids[25:]], table)
    got = metrics.compute()
    expected = _brute_force(
        queries.numpy(),
        positive_ids.numpy()[:, None],
        table[positive_ids].numpy()[:, None],
        table.numpy(),
        np.arange(300),
        KS,
    )
    assert list(got) == list(metric_names(KS))
    assert got == pytest.approx(expected, rel=1e-12)
    assert 0.0 < got["recall@5"] < got["recall@20"] < 1.0  # the data spreads the positives
    assert got["recall@5"] == got["hit_rate@5"]  # one positive per query


def test_several_positives_per_query_with_padding() -> None:
    table = _table(120, 5, seed=3)
    queries = _queries(30, table, 4)
    generator = torch.Generator().manual_seed(5)
    positive_ids = torch.stack([torch.randperm(120, generator=generator)[:4] for _ in range(30)])
    positive_ids[::3, 2:] = -1  # some queries hold two positives
    positive_ids[7] = -1  # and one none: it counts for nothing
    positives = table[positive_ids.clamp(min=0)]
    metrics = RetrievalMetrics(KS, chunk_size=50)
    metrics.update(queries, positive_ids, positives, table)
    got = metrics.compute()
    expected = _brute_force(queries.numpy(), positive_ids.numpy(), positives.numpy(), table.numpy(), np.arange(120), KS)
    assert got == pytest.approx(expected, rel=1e-12)
    assert got["recall@5"] != got["hit_rate@5"]


def test_queries_ranked_in_blocks_of_bounded_scores_give_the_whole_batch_figures() -> None:
    """A long window (a million queries) must not build its whole score matrix: blocks of rows agree."""
    table = _table(120, 5, seed=3)
    queries = _queries(30, table, 4)
    positive_ids = torch.randint(0, 120, (30, 2), generator=torch.Generator().manual_seed(5))
    positive_ids[::4, 1] = -1
    seen = torch.randint(0, 120, (30, 3), generator=torch.Generator().manual_seed(6))
    positives = table[positive_ids.clamp(min=0)]
    whole = RetrievalMetrics(KS, chunk_size=50)
    blocked = RetrievalMetrics(KS, chunk_size=50, max_scores=7 * 25)  # 7 queries a block
    for metrics in (whole, blocked):
        metrics.update(queries, positive_ids, positives, table, seen=seen)
    assert blocked.compute() == whole.compute()


def test_sampled_candidates_are_named_and_skip_the_positives_ids() -> None:
    table = _table(200, 4, seed=6)
    queries = _queries(25, table, 7)
    positive_ids = torch.randint(0, 200, (25,), generator=torch.Generator().manual_seed(8))
    sampled = torch.randint(0, 200, (60,), generator=torch.Generator().manual_seed(9))
    sampled[:5] = positive_ids[:5]  # a sampled id that is a query's positive is not its negative
    metrics = RetrievalMetrics((10,), candidates="sampled", chunk_size=16)
    metrics.update(queries, positive_ids, table[positive_ids], table[sampled], sampled)
    got = metrics.compute()
    expected = _brute_force(
        queries.numpy(),
        positive_ids.numpy()[:, None],
        table[positive_ids].numpy()[:, None],
        table[sampled].numpy(),
        sampled.numpy(),
        (10,),
    )
    assert list(got) == ["sampled_recall@10", "sampled_ndcg@10", "sampled_hit_rate@10", "sampled_mrr"]
    assert list(got.values()) == pytest.approx([expected[n.removeprefix("sampled_")] for n in got], rel=1e-12)


def test_ties_count_against_the_positive() -> None:
    # A collapsed model scores every item alike: its positives rank last, not first.
    table = torch.ones(50, 3)
    metrics = RetrievalMetrics((10,))
    metrics.update(torch.ones(4, 3), torch.tensor([0, 9, 20, 49]), table[[0, 9, 20, 49]], table)
    got = metrics.compute()
    assert got == {"recall@10": 0.0, "ndcg@10": 0.0, "hit_rate@10": 0.0, "mrr": 1 / 50}


def test_a_window_starts_empty_after_compute_and_prints_like_other_metrics() -> None:
    table = _table(20, 3)
    metrics = RetrievalMetrics((10,))
    metrics.update(table[:4], torch.arange(4), table[:4], table)
    values = metrics.compute()
    assert metrics.compute() == {name: None for name in metric_names((10,))}
    line = format_metrics({"retrieval": values})
    shown = " ".join(f"{name} {value:.4f}" for name, value in values.items())
    assert line == f"  retrieval: {shown}"
    assert line.startswith("  retrieval: recall@10 ")


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError) as error:
        RetrievalMetrics((10,), candidates="all")
    assert str(error.value) == "retrieval metrics: candidates 'all' is not one of exact, sampled"
    with pytest.raises(ValueError) as error:
        RetrievalMetrics((0, 5))
    assert str(error.value) == "retrieval metrics: every k must be at least 1 (got [0, 5])"


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
    table = _table()
    queries = _queries(40, table, 1)
    positive_ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(2))
    mine = slice(0, 29) if rank == 0 else slice(29, 40)  # unequal shares of the queries
    metrics = RetrievalMetrics(KS)
    metrics.update(queries[mine], positive_ids[mine], table[positive_ids[mine]], table)
    values = metrics.compute(dist.group.WORLD)
    if rank == 0:
        torch.save(values, Path(out) / "metrics.pt")
    close_process_group()


def test_two_ranks_report_what_one_process_does(tmp_path: Path) -> None:
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2)
    got: dict[str, Any] = torch.load(tmp_path / "metrics.pt")
    table = _table()
    queries = _queries(40, table, 1)
    positive_ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(2))
    one = RetrievalMetrics(KS)
    one.update(queries, positive_ids, table[positive_ids], table)
    assert got == pytest.approx(one.compute(), rel=1e-12)


@pytest.mark.parametrize("sampled", [False, True])
def test_seen_items_are_no_candidates(sampled: bool) -> None:
    table = _table(150, 5, seed=10)
    queries = _queries(30, table, 11)
    generator = torch.Generator().manual_seed(12)
    positive_ids = torch.randint(0, 150, (30,), generator=generator)
    seen = torch.randint(0, 150, (30, 6), generator=generator)
    seen[::4, 3:] = -1  # histories of several lengths
    seen[1, 0] = positive_ids[1]  # a seen item that is the positive stays the positive
    ids = torch.randint(0, 150, (80,), generator=generator) if sampled else torch.arange(150)
    metrics = RetrievalMetrics((5, 20), candidates="sampled" if sampled else "exact", chunk_size=23)
    metrics.update(queries, positive_ids, table[positive_ids], table[ids], ids if sampled else None, seen=seen)
    got = metrics.compute()
    # brute force, one query at a time, its seen items taken out of the candidates
    expected: dict[str, float] = {}
    for row in range(30):
        others = seen[row][(seen[row] >= 0) & (seen[row] != positive_ids[row])]
        unseen = ~torch.isin(ids, others)
        one = _brute_force(
            queries[row : row + 1].numpy(),
            positive_ids[row : row + 1, None].numpy(),
            table[positive_ids[row : row + 1]][:, None].numpy(),
            table[ids[unseen]].numpy(),
            ids[unseen].numpy(),
            (5, 20),
        )
        for name, value in one.items():
            expected[name] = expected.get(name, 0.0) + value / 30
    prefix = "sampled_" if sampled else ""
    assert got == pytest.approx({prefix + name: value for name, value in expected.items()}, rel=1e-12)
    unmasked = RetrievalMetrics((5, 20), candidates="sampled" if sampled else "exact")
    unmasked.update(queries, positive_ids, table[positive_ids], table[ids], ids if sampled else None)
    assert unmasked.compute()[prefix + "mrr"] < got[prefix + "mrr"]  # masking moves positives up


def test_per_user_metrics_average_each_users_mean() -> None:
    # Three queries of user 7 and one of user 9 over a 4-item table of one-hot rows: the scores are the queries.
    table = torch.eye(4)
    queries = torch.tensor([[0.9, 0.1, 0.0, 0.0], [0.1, 0.9, 0.0, 0.0], [0.0, 0.2, 0.3, 0.1], [0.0, 0.0, 0.0, 1.0]])
    positive_ids = torch.tensor([0, 0, 0, 3])  # positions 0, 1, 3 for user 7; 0 for user 9
    metrics = RetrievalMetrics((1,), per_user=True)
    metrics.update(queries, positive_ids, table[positive_ids], table, users=torch.tensor([7, 7, 7, 9]))
    got = metrics.compute()
    assert got["recall@1"] == pytest.approx((1 + 0 + 0 + 1) / 4)
    assert got["user_recall@1"] == pytest.approx(((1 + 0 + 0) / 3 + 1) / 2)
    assert got["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 4 + 1) / 4)
    assert got["user_mrr"] == pytest.approx(((1 + 1 / 2 + 1 / 4) / 3 + 1) / 2)
    assert list(got) == [*metric_names((1,)), "user_recall@1", "user_ndcg@1", "user_hit_rate@1", "user_mrr"]
