"""Retrieval metrics: recall@k, NDCG@k, MRR and hit rate of held-out positives.

Each query has one or more held-out positive items (a [B, P] id matrix, -1
padding). A positive's position is the number of other candidates that score
at least as high as it does (ties count against the positive, so a collapsed
model scores worst, not best); positives rank against the candidates and the
query's other positives. Per query, with relevant items R and k:

    hit_rate@k  1 if some positive's position < k
    recall@k    |{positives with position < k}| / |R|
    ndcg@k      sum over positives with position p < k of 1 / log2(p + 2),
                over the ideal sum over the first min(|R|, k) positions
    mrr         1 / (1 + the best positive's position)

A query's `seen` items (its history, -1 padding) are no candidates when
given: the positive ranks among the items the user has not seen (a seen
item that is also a positive still counts as a positive).

The candidates are either the whole item table (`exact`) or a sampled set
(`sampled`); sampled metrics are named with a `sampled_` prefix
(`sampled_recall@10`), so the progress line, the JSON result and the run log
say which they are. Candidates are scored in chunks of `chunk_size` rows, and
`RetrievalMetrics` ranks its queries in blocks of at most `max_scores` scores,
so neither a table of a million items nor a window of a million queries (a
long logging window) ever needs the whole score matrix at once.

`RetrievalMetrics` accumulates per-query sums over a window and `compute` (a
collective) all-reduces the sums and the query count in float64, so N ranks
report what one process would. With `per_user` it also reports each metric
averaged per user (`user_recall@10`: the mean over users of their queries'
mean, so a user with many held-out rows weighs as much as one with a single
row): `update` takes each query's user id, and `compute` gathers every
rank's per-query values and users, since one user's rows may be on any rank. Its result has the shape of
runtime.reporting.metrics' MetricValues ({metric: value}), so the console,
the run log and the result line print it as they print NE and AUC.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist

from runtime.retrieval.gather import distributed, gather_rows

__all__ = ["CANDIDATES", "RetrievalMetrics", "metric_names", "positive_positions", "query_metrics"]

CANDIDATES = ("exact", "sampled")
DEFAULT_CHUNK = 1 << 16
DEFAULT_MAX_SCORES = 1 << 24  # scores of one block of queries: 64 MiB of float32


def positive_positions(
    queries: torch.Tensor,
    positive_ids: torch.Tensor,
    positives: torch.Tensor,
    candidates: torch.Tensor,
    candidate_ids: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, P] positions (float64; padding -1 gives +inf) of each query's positives.

    `queries` [B, D]; `positive_ids` [B, P] (-1: padding); `positives`
    [B, P, D] their embeddings; `candidates` [N, D] with `candidate_ids` [N]
    (default: row numbers, the exact case over a whole table). A candidate
    with the id of one of the query's positives is not counted as a candidate
    (the positives are counted among themselves instead); nor is one with the
    id of one of its `seen` items ([B, S], -1 padding).
    """
    queries = queries.detach().float()
    valid = positive_ids >= 0
    own = torch.einsum("bd,bpd->bp", queries, positives.detach().float())
    # Among the positives themselves: the others scoring at least as high.
    beaten = (own.unsqueeze(1) >= own.unsqueeze(2)) & valid.unsqueeze(1)
    count = beaten.sum(dim=2) - 1
    masked = positive_ids if seen is None else torch.cat([positive_ids, seen.to(positive_ids.device)], dim=1)
    step = max(1, chunk_size // max(1, masked.shape[1]))  # the [B, P + S, chunk] comparison stays bounded
    for start in range(0, candidates.shape[0], step):
        block = candidates[start : start + step].detach().float()
        ids = None if candidate_ids is None else candidate_ids[start : start + step].to(positive_ids.device)
        scores = queries @ block.T  # [B, c]
        if candidate_ids is None:  # row numbers: each positive's (and seen item's) row in the chunk is known
            rows = masked - start
            inside = (masked >= 0) & (rows >= 0) & (rows < block.shape[0])
            query_rows = torch.arange(queries.shape[0], device=rows.device).unsqueeze(1).expand_as(rows)
            scores[query_rows[inside], rows[inside]] = float("-inf")
        else:
            is_masked = (ids.view(1, 1, -1) == masked.unsqueeze(2)).any(dim=1)  # [B, c]
            scores = scores.masked_fill(is_masked, float("-inf"))
        count += (scores.unsqueeze(1) >= own.unsqueeze(2)).sum(dim=2)
    positions = count.to(torch.float64)
    return positions.masked_fill(~valid, float("inf"))


def query_metrics(positions: torch.Tensor, positive_ids: torch.Tensor, ks: Sequence[int]) -> dict[str, torch.Tensor]:
    """Per query [B] (float64): hit_rate@k, recall@k, ndcg@k for each k, and mrr."""
    relevant = (positive_ids >= 0).sum(dim=1).to(torch.float64)
    gains = 1.0 / torch.log2(positions + 2.0)  # +inf positions (padding) give 0
    values: dict[str, torch.Tensor] = {}
    for k in ks:
        inside = positions < k
        ideal = torch.tensor([sum(1.0 / math.log2(p + 2) for p in range(n)) for n in range(k + 1)], dtype=torch.float64)
        values[f"recall@{k}"] = inside.sum(dim=1) / relevant.clamp(min=1)
        values[f"ndcg@{k}"] = (gains * inside).sum(dim=1) / ideal[relevant.long().clamp(max=k)].clamp(min=1e-300)
        values[f"hit_rate@{k}"] = inside.any(dim=1).to(torch.float64)
    values["mrr"] = 1.0 / (positions.min(dim=1).values + 1.0)
    return values


def metric_names(ks: Sequence[int], candidates: str = "exact", per_user: bool = False) -> tuple[str, ...]:
    """The names `compute` reports, in order: recall, ndcg, hit rate per k, then mrr (then the
    same averaged per user, `user_recall@k` ..., with `per_user`)."""
    prefix = "sampled_" if candidates == "sampled" else ""
    names = (*(f"{name}@{k}" for k in ks for name in ("recall", "ndcg", "hit_rate")), "mrr")
    users = tuple(f"user_{name}" for name in names) if per_user else ()
    return tuple(prefix + name for name in (*names, *users))


class RetrievalMetrics:
    """Sums of the per-query metrics over a window, combined over ranks by `compute`."""

    def __init__(
        self,
        ks: Sequence[int] = (10,),
        candidates: str = "exact",
        chunk_size: int = DEFAULT_CHUNK,
        per_user: bool = False,
        max_scores: int = DEFAULT_MAX_SCORES,
    ) -> None:
        if candidates not in CANDIDATES:
            raise ValueError(f"retrieval metrics: candidates {candidates!r} is not one of {', '.join(CANDIDATES)}")
        if not ks or any(k < 1 for k in ks):
            raise ValueError(f"retrieval metrics: every k must be at least 1 (got {list(ks)})")
        self.ks = tuple(ks)
        self.candidates = candidates
        self.chunk_size = chunk_size
        self.per_user = per_user
        self.max_scores = max_scores
        self.names = metric_names(self.ks, candidates)
        self.user_names = metric_names(self.ks, candidates, per_user)[len(self.names) :]
        self.reset()

    def reset(self) -> None:
        self._sums = torch.zeros(len(self.names) + 1, dtype=torch.float64)  # + the query count
        self._per_query: list[torch.Tensor] = []  # per_user: [n, metrics + 1] values and the user id

    def update(
        self,
        queries: torch.Tensor,
        positive_ids: torch.Tensor,
        positives: torch.Tensor,
        candidates: torch.Tensor,
        candidate_ids: torch.Tensor | None = None,
        seen: torch.Tensor | None = None,
        users: torch.Tensor | None = None,
    ) -> None:
        """Add a batch of queries (see `positive_positions` for the arguments; 1-d ids: one positive);
        `users` [B]: each query's user id, needed with `per_user`."""
        if positive_ids.dim() == 1:
            positive_ids, positives = positive_ids.unsqueeze(1), positives.unsqueeze(1)
        keep = (positive_ids >= 0).any(dim=1)  # a query without positives counts for nothing
        positive_ids, positives, queries = positive_ids[keep], positives[keep], queries[keep]
        seen = None if seen is None else seen[keep]
        per_chunk = min(candidates.shape[0], max(1, self.chunk_size // max(1, positive_ids.shape[1])))
        rows = max(1, self.max_scores // max(1, per_chunk))
        blocks = [
            positive_positions(
                queries[start : start + rows],
                positive_ids[start : start + rows],
                positives[start : start + rows],
                candidates,
                candidate_ids,
                self.chunk_size,
                seen=None if seen is None else seen[start : start + rows],
            )
            for start in range(0, queries.shape[0], rows)
        ]
        positions = torch.cat(blocks) if blocks else torch.zeros(0, positive_ids.shape[1], dtype=torch.float64)
        values = query_metrics(positions, positive_ids, self.ks)
        unprefixed = [name.removeprefix("sampled_") for name in self.names]
        sums = [float(values[name].sum()) for name in unprefixed]
        self._sums += torch.tensor([*sums, float(positive_ids.shape[0])], dtype=torch.float64)
        if self.per_user:
            if users is None:
                raise ValueError("retrieval metrics: per-user metrics need each query's user id")
            columns = [values[name] for name in unprefixed] + [users[keep.cpu()].cpu().to(torch.float64)]
            self._per_query.append(torch.stack(columns, dim=1))

    def compute(self, process_group: dist.ProcessGroup | None = None) -> dict[str, float | None]:
        """{metric: mean over the window's queries of all ranks} (None without queries); a collective."""
        sums = self._sums
        if distributed(process_group):
            nccl = dist.get_backend(process_group) == "nccl"
            sums = sums.to(torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu", copy=True)
            dist.all_reduce(sums, group=process_group)
            sums = sums.cpu()
        *totals, count = sums.tolist()
        result = {name: (total / count if count else None) for name, total in zip(self.names, totals)}
        if self.per_user:
            result.update(self._per_user(process_group))
        self.reset()
        return result

    def _per_user(self, process_group: dist.ProcessGroup | None) -> dict[str, float | None]:
        """Each metric's mean over users of the user's mean over their queries, every rank's queries."""
        width = len(self.names) + 1
        rows = torch.cat(self._per_query) if self._per_query else torch.zeros(0, width, dtype=torch.float64)
        with torch.no_grad():
            rows, _ = gather_rows(rows, process_group)
        if not rows.shape[0] or bool(rows[:, -1].isnan().any()):  # no queries, or some without a user
            return {name: None for name in self.user_names}
        _, user = torch.unique(rows[:, -1], return_inverse=True)
        users = int(user.max()) + 1
        count = torch.zeros(users, dtype=torch.float64).index_add_(0, user, torch.ones_like(rows[:, -1]))
        means = torch.zeros(users, width - 1, dtype=torch.float64).index_add_(0, user, rows[:, :-1]) / count[:, None]
        return {name: float(value) for name, value in zip(self.user_names, means.mean(dim=0))}
