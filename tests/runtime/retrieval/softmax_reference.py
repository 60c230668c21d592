"""The sampled softmax written out with Python floats, one query and one candidate at a time.

The reference the tests hold runtime.retrieval.sampled_softmax to: for each
query, the list of candidates (global positives, then uniform negatives),
each logit <q, e> / temperature - log Q, accidental hits dropped, and the
loss -(own logit - log sum exp of the kept logits).
"""

from __future__ import annotations

import math
from typing import Sequence


def _normalized(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / max(norm, 1e-12) for x in vector]


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def reference_losses(
    query: list[list[float]],
    positive: list[list[float]],
    positive_ids: list[int],
    *,
    in_batch: bool,
    negatives: list[list[float]] | None = None,
    negative_ids: list[int] | None = None,
    in_batch_log_q: list[float] | None = None,
    negative_log_q: float | None = None,
    temperature: float = 1.0,
    normalize: bool = False,
) -> list[float]:
    """Per query of the whole (global) batch: its loss."""
    if normalize:
        query = [_normalized(q) for q in query]
        positive = [_normalized(p) for p in positive]
        negatives = None if negatives is None else [_normalized(n) for n in negatives]
    losses = []
    for i, q in enumerate(query):
        kept: list[float] = []
        own = 0.0
        if in_batch:
            for j, p in enumerate(positive):
                logit = _dot(q, p) / temperature - (in_batch_log_q[j] if in_batch_log_q else 0.0)
                if j == i:
                    own = logit
                elif positive_ids[j] == positive_ids[i]:
                    continue
                kept.append(logit)
        else:
            own = _dot(q, positive[i]) / temperature - (negative_log_q or 0.0)
            kept.append(own)
        for n, n_id in zip(negatives or [], negative_ids or []):
            if n_id == positive_ids[i]:
                continue
            kept.append(_dot(q, n) / temperature - (negative_log_q or 0.0))
        top = max(kept)
        losses.append(-(own - top - math.log(sum(math.exp(x - top) for x in kept))))
    return losses
