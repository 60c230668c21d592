"""The metrics of a retrieval head over a window: held-out positives ranked against the item table.

`MetricSet` (runtime.reporting.metrics) keeps one of these per
`sampled_softmax` head. `update` keeps the window's held-out queries and
positive ids (runtime.retrieval.head.RetrievalOutput.held_out); `compute`, a
collective, takes a catalogue (runtime.retrieval.catalogue: every item's
vector, or at the log steps of training a sample of them for a large
table), ranks each query's positive against it (runtime.retrieval.metrics)
and reports the head's metrics, summed over every rank's queries: what one
process would report. Metrics over a sample are named with a `sampled_`
prefix. A query's norm does not change its ranking, so queries are ranked as
they come; the catalogue is normalised already when the head normalises.
In training (`update` given a `StepCandidates`) each step's queries are
ranked against the step's candidates and with its positives' vectors as the
step's forward computed them (runtime.retrieval.catalogue), never with
vectors read after the updates that followed it. The steps are kept and
ranked together at the log step, or every `kept_steps` steps when the
window is longer: one exchange across ranks for many steps (with in-batch
candidates), and memory bounded whatever the window's length.

With `mask_seen` (a next-item head's default, the spec's `mask_seen`) the
items of each query's history are no candidates: the held-out item ranks
among the items its user has not seen, as RecBole's full-sort metrics rank.
Metrics named `user_...` average per user (runtime.retrieval.metrics): the
batches' labels then carry each sample's user id under runtime.data.columns.USER_IDS (the
MovieLens reader puts it there when a head asks for them).
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import torch
import torch.distributed as dist

from runtime.retrieval.catalogue import Catalogue, KeptStep, StepCandidates
from runtime.retrieval.head import RetrievalOutput
from runtime.retrieval.metrics import RetrievalMetrics

__all__ = ["KEPT_STEPS", "RetrievalHeadMetrics", "metric_ks", "wants_users"]

KEPT_STEPS = 64  # training steps kept before they are ranked: about 20 MB for 128 queries of 200-item histories


def wants_users(metrics: Sequence[str]) -> bool:
    """Whether metrics averaged per user are among `metrics`."""
    return any(name.startswith("user_") for name in metrics)


_AT_K = re.compile(r"(?:user_)?(recall|ndcg|hit_rate)@([0-9]+)")


def metric_ks(metrics: Sequence[str]) -> tuple[int, ...]:
    """The k of `recall@k`-style names, sorted; (1,) when only mrr is asked for."""
    ks = sorted({int(match.group(2)) for name in metrics if (match := _AT_K.fullmatch(name))})
    return tuple(ks) or (1,)


class RetrievalHeadMetrics:
    """One retrieval head's window of held-out queries; `metrics` names what `compute` reports."""

    def __init__(self, metrics: Sequence[str], mask_seen: bool = True, kept_steps: int = KEPT_STEPS) -> None:
        self.metrics = tuple(metrics)
        self.mask_seen = mask_seen
        self.kept_steps = kept_steps
        self.per_user = wants_users(self.metrics)
        self._ks = metric_ks(self.metrics)
        self.reset()

    def reset(self) -> None:
        self._queries: list[torch.Tensor] = []
        self._ids: list[torch.Tensor] = []
        self._positives: list[torch.Tensor] = []
        self._seen: list[torch.Tensor] = []
        self._users: list[torch.Tensor] = []
        self._ranked = RetrievalMetrics(self._ks, StepCandidates.kind, per_user=self.per_user)
        # training's steps not ranked yet: each one's pairs, seen items (or None) and users (or None)
        self.kept: list[tuple[KeptStep, torch.Tensor | None, torch.Tensor | None]] = []

    def update(
        self,
        output: RetrievalOutput,
        real: int | None = None,
        users: torch.Tensor | None = None,
        step: StepCandidates | None = None,
    ) -> None:
        """Add a batch's held-out queries; only the first `real` samples' when given (the rest is padding).
        `users`: each sample's user id, for the per-user metrics. `step`: training's candidates; the
        step is then kept, and the kept steps ranked once there are `kept_steps` of them (a collective
        with in-batch candidates: every rank adds as many steps)."""
        if real is not None:
            output = RetrievalOutput(output.query[:real], output.positive[:real], output.ids[:real])
        held = output.held_out_pairs()
        known = None
        if self.per_user:  # NaN: data without user ids (the per-user metrics are then None)
            known = users[held.samples.to(users.device)].detach().cpu().double() if users is not None else None
            known = torch.full((held.ids.shape[0],), math.nan, dtype=torch.float64) if known is None else known
        if step is not None:
            seen = held.history.detach().cpu() if self.mask_seen and held.history.shape[1] else None
            self.kept.append((step.kept(held), seen, known))
            if len(self.kept) >= self.kept_steps:
                self._rank_kept(step)
            return
        if known is not None:
            self._users.append(known)
        self._queries.append(held.queries.detach().float().cpu())
        self._ids.append(held.ids.detach().cpu())
        self._positives.append(held.positives.detach().float().cpu())
        if self.mask_seen:
            self._seen.append(held.history.detach().cpu())

    def compute(
        self, catalogue: Catalogue | StepCandidates, process_group: dist.ProcessGroup | None = None
    ) -> dict[str, float | None]:
        """The window's metrics over every rank's queries (a collective), then a new window;
        named `sampled_<metric>` when the catalogue is a sample."""
        if isinstance(catalogue, StepCandidates):
            self._rank_kept(catalogue)
            values = self._ranked.compute(process_group)
            self.reset()
            return {"sampled_" + name: values.get("sampled_" + name) for name in self.metrics}
        ids = torch.cat(self._ids) if self._ids else torch.zeros(0, dtype=torch.long)
        vectors, candidate_ids, positives = catalogue.candidates(ids, process_group)
        queries = torch.cat(self._queries) if self._queries else torch.zeros(0, vectors.shape[1])
        users = torch.cat(self._users) if self._users else None
        ranker = RetrievalMetrics(self._ks, catalogue.kind, per_user=self.per_user)
        if ids.numel():
            ranker.update(queries, ids, positives, vectors, candidate_ids, seen=_padded(self._seen), users=users)
        values = ranker.compute(process_group)
        self.reset()
        prefix = "sampled_" if catalogue.kind == "sampled" else ""
        return {prefix + name: values.get(prefix + name) for name in self.metrics}

    def _rank_kept(self, step: StepCandidates) -> None:
        """Rank every kept step against its own candidates (a collective with in-batch candidates)."""
        candidates = step.candidates([kept for kept, _, _ in self.kept])
        for (kept, seen, users), (vectors, ids) in zip(self.kept, candidates, strict=True):
            self._ranked.update(kept.queries, kept.ids, kept.positives, vectors, ids, seen=seen, users=users)
        self.kept = []


def _padded(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """Batches of [n, S_i] history ids (-1 padding) as one [sum n, max S_i] tensor; None when empty."""
    if not parts or not max(part.shape[1] for part in parts):
        return None
    width = max(part.shape[1] for part in parts)
    return torch.cat([torch.nn.functional.pad(part, (0, width - part.shape[1]), value=-1) for part in parts])
