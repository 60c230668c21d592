"""Nearest-neighbour search over item embeddings by inner product: exact, or FAISS.

`build_index(embeddings [N, D], ids [N], kind)` returns an index whose
`search(queries [B, D], k)` gives the top-k (scores [B, k], ids [B, k]),
best first, by inner product:

    exact   torch: every item scored, top-k kept chunk by chunk (no faiss needed)
    flat    faiss.IndexFlatIP: exact, on faiss's kernels
    ivf     faiss.IndexIVFFlat: `nlist` k-means cells, `nprobe` searched (approximate)
    hnsw    faiss.IndexHNSWFlat: a graph of `hnsw_m` links, `ef_search` wide (approximate)
    auto    flat up to 65,536 items and ivf above, with faiss; exact without it

FAISS (`pip install 'reccompile[faiss]'`) is optional: without it only
`exact` (and `auto`, which then means exact) can be built or loaded. Where an
approximate index finds fewer than k items, the missing ones have id -1 and
score -inf. Save and load with runtime.retrieval.index_files.

    >>> index = build_index(torch.eye(3), torch.tensor([7, 8, 9]), kind="exact")
    >>> index.search(torch.tensor([[0.0, 2.0, 1.0]]), k=2)
    (tensor([[2., 1.]]), tensor([[8, 9]]))
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

__all__ = ["INDEX_KINDS", "ExactIndex", "FaissIndex", "ItemIndex", "build_index", "faiss_available", "require_faiss"]

INDEX_KINDS = ("auto", "exact", "flat", "ivf", "hnsw")
FAISS_KINDS = ("flat", "ivf", "hnsw")
AUTO_FLAT_LIMIT = 1 << 16
SEARCH_CHUNK = 1 << 16


def faiss_available() -> bool:
    return importlib.util.find_spec("faiss") is not None


def require_faiss(kind: str) -> Any:
    """The faiss module; a RuntimeError naming `kind` and the extra when it is not installed."""
    if not faiss_available():
        raise RuntimeError(
            f"a {kind!r} index needs faiss, which is not installed (pip install 'reccompile[faiss]'); "
            "kind 'exact' needs no faiss"
        )
    import faiss

    return faiss


@dataclass
class ExactIndex:
    """Every item scored by a matrix product, the top-k merged across chunks of `chunk_size` items."""

    embeddings: torch.Tensor
    ids: torch.Tensor
    chunk_size: int = SEARCH_CHUNK
    kind: str = field(default="exact", init=False)

    @property
    def params(self) -> dict[str, Any]:
        return {}

    @torch.no_grad()
    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        queries = queries.detach().to(torch.float32)
        best_scores = torch.full((queries.shape[0], 0), float("-inf"))
        best_rows = torch.zeros((queries.shape[0], 0), dtype=torch.long)
        for start in range(0, self.embeddings.shape[0], self.chunk_size):
            scores = queries @ self.embeddings[start : start + self.chunk_size].T
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            merged = torch.cat([best_scores, top.values], dim=1)
            rows = torch.cat([best_rows, top.indices + start], dim=1)
            keep = merged.topk(min(k, merged.shape[1]), dim=1)
            best_scores, best_rows = keep.values, rows.gather(1, keep.indices)
        return _pad(best_scores, self.ids[best_rows], k)


@dataclass
class FaissIndex:
    """A faiss inner-product index over rows 0..N-1 and the item id of each row."""

    index: Any
    ids: torch.Tensor
    kind: str
    params: Mapping[str, Any]

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        found = np.ascontiguousarray(queries.detach().to(torch.float32).cpu().numpy())
        scores, rows = self.index.search(found, min(k, self.index.ntotal))
        rows_t = torch.from_numpy(rows).long()
        ids = torch.where(rows_t >= 0, self.ids[rows_t.clamp(min=0)], torch.full_like(rows_t, -1))
        scores_t = torch.from_numpy(scores).float().masked_fill(rows_t < 0, float("-inf"))
        return _pad(scores_t, ids, k)


ItemIndex = ExactIndex | FaissIndex


def _pad(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Widen to k columns (a table of fewer than k items) with score -inf and id -1."""
    missing = k - scores.shape[1]
    if missing <= 0:
        return scores, ids
    pad_scores = torch.full((scores.shape[0], missing), float("-inf"))
    pad_ids = torch.full((ids.shape[0], missing), -1, dtype=ids.dtype)
    return torch.cat([scores, pad_scores], dim=1), torch.cat([ids, pad_ids], dim=1)


def build_index(
    embeddings: torch.Tensor,
    ids: torch.Tensor | None = None,
    kind: str = "auto",
    *,
    nlist: int | None = None,
    nprobe: int = 16,
    hnsw_m: int = 32,
    ef_search: int = 128,
    ef_construction: int = 200,
) -> ItemIndex:
    """An index over `embeddings` [N, D] whose rows are items `ids` [N] (default 0..N-1).

    ivf: `nlist` cells (default 4 * sqrt(N), at most N / 39 so k-means has
    enough points), `nprobe` of them searched. hnsw: `hnsw_m` links per node,
    `ef_construction` and `ef_search` candidate lists while building and
    searching.
    """
    if kind not in INDEX_KINDS:
        raise ValueError(f"index kind {kind!r} is not one of {', '.join(INDEX_KINDS)}")
    if embeddings.dim() != 2 or embeddings.shape[0] == 0:
        raise ValueError(f"index: embeddings must be [N, D] with N >= 1 (got shape {list(embeddings.shape)})")
    count = embeddings.shape[0]
    ids = torch.arange(count) if ids is None else ids.detach().cpu().long().reshape(-1)
    if ids.numel() != count:
        raise ValueError(f"index: {ids.numel()} ids for {count} embeddings")
    vectors = embeddings.detach().cpu().to(torch.float32).contiguous()
    if kind == "auto":
        kind = ("flat" if count <= AUTO_FLAT_LIMIT else "ivf") if faiss_available() else "exact"
    if kind == "exact":
        return ExactIndex(vectors, ids)
    faiss = require_faiss(kind)
    dim, data = vectors.shape[1], vectors.numpy()
    if kind == "flat":
        index, params = faiss.IndexFlatIP(dim), {}
    elif kind == "ivf":
        cells = nlist or max(1, min(int(4 * math.sqrt(count)), count // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, cells, faiss.METRIC_INNER_PRODUCT)
        index.train(data)
        index.nprobe = min(nprobe, cells)
        params = {"nlist": cells, "nprobe": index.nprobe}
    else:
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
        params = {"hnsw_m": hnsw_m, "ef_construction": ef_construction, "ef_search": ef_search}
    index.add(data)
    return FaissIndex(index, ids, kind, params)


def apply_search_params(index: Any, kind: str, params: Mapping[str, Any]) -> None:
    """Set the search-time parameters of a loaded faiss index (they are not all in its file)."""
    if kind == "ivf":
        index.nprobe = int(params["nprobe"])
    elif kind == "hnsw":
        index.hnsw.efSearch = int(params["ef_search"])
