"""How much an approximate index loses against exact search.

Two figures at one k, over a set of queries:

    overlap        the mean share of exact search's top-k that the index also
                   returns (the usual "recall of an ANN index")
    recall ratio   with held-out positives: the index's recall@k of them over
                   exact search's recall@k of them

`check_index` returns both; `IndexQuality.ok` says whether the index keeps
`threshold` (default 0.95) of exact recall@k (of the overlap when no
positives are given), and `describe()` is the line an export prints.

    >>> IndexQuality("ivf", 3, overlap=2 / 3, recall=0.45, exact_recall=0.5, threshold=0.95).describe()
    'index ivf: recall@3 0.4500 vs exact 0.5000 (ratio 0.9000), top-3 overlap 0.6667: BELOW 0.95 of exact search'

    (`check_index(index, exact, queries, k, positive_ids)` measures those figures.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.retrieval.index import ItemIndex

__all__ = ["IndexQuality", "check_index", "held_out_recall", "top_k_overlap"]


@dataclass(frozen=True, slots=True)
class IndexQuality:
    kind: str
    k: int
    overlap: float
    recall: float | None  # the index's recall@k of held-out positives
    exact_recall: float | None
    threshold: float

    @property
    def ratio(self) -> float | None:
        if self.recall is None or not self.exact_recall:
            return None
        return self.recall / self.exact_recall

    @property
    def ok(self) -> bool:
        figure = self.ratio if self.ratio is not None else self.overlap
        return figure >= self.threshold

    def describe(self) -> str:
        verdict = f"ok (>= {self.threshold:g})" if self.ok else f"BELOW {self.threshold:g} of exact search"
        if self.ratio is None:
            return f"index {self.kind}: top-{self.k} overlap with exact search {self.overlap:.4f}: {verdict}"
        return (
            f"index {self.kind}: recall@{self.k} {self.recall:.4f} vs exact {self.exact_recall:.4f} "
            f"(ratio {self.ratio:.4f}), top-{self.k} overlap {self.overlap:.4f}: {verdict}"
        )


def top_k_overlap(found: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean over queries of |found ∩ exact| / |exact| for id matrices [B, k] (-1 ids ignored)."""
    shares = []
    for row, truth in zip(found.tolist(), exact.tolist()):
        wanted = {i for i in truth if i >= 0}
        shares.append(len(wanted & set(row)) / len(wanted) if wanted else 1.0)
    return sum(shares) / len(shares) if shares else 1.0


def held_out_recall(found: torch.Tensor, positive_ids: torch.Tensor) -> float | None:
    """Mean over queries with positives of the share of them in `found` [B, k]; ids [B] or [B, P]."""
    if positive_ids.dim() == 1:
        positive_ids = positive_ids.unsqueeze(1)
    valid = positive_ids >= 0
    hit = (positive_ids.unsqueeze(2) == found.unsqueeze(1)).any(dim=2) & valid
    has = valid.any(dim=1)
    if not bool(has.any()):
        return None
    per_query = hit.sum(dim=1)[has].double() / valid.sum(dim=1)[has].double()
    return float(per_query.mean())


def check_index(
    index: ItemIndex,
    exact: ItemIndex,
    queries: torch.Tensor,
    k: int = 100,
    positive_ids: torch.Tensor | None = None,
    threshold: float = 0.95,
) -> IndexQuality:
    """The index's top-k against `exact`'s over `queries` [B, D] (see the module docstring)."""
    _, found = index.search(queries, k)
    _, truth = exact.search(queries, k)
    recall = exact_recall = None
    if positive_ids is not None:
        recall, exact_recall = held_out_recall(found, positive_ids), held_out_recall(truth, positive_ids)
    return IndexQuality(index.kind, k, top_k_overlap(found, truth), recall, exact_recall, threshold)
