"""The query and item vectors of an exported retrieval model, and the catalogue of its items.

A generated inference module of a spec with a `sampled_softmax` head has a
RETRIEVAL constant (the head, its item feature and table, `normalize`, the
vector width) and two methods built on the helpers here:

    model.query_vectors(dense, sparse)   the query tower on requests          [B, D]
    model.item_vectors(ids)              the item tower on item table rows    [n, D]

Both are L2-normalised when the head normalises, as in training. The item
tower reads the item feature only (the spec's checks guarantee it), so
`item_request` feeds that feature the rows and every other feature nothing;
or, with the head's `item_attributes`, also each row's attribute ids, which
the model's item catalogue (trained with it, runtime.retrieval.item_attributes) gives.

The catalogue is what an index holds: rows of the item table and the item id
of each. With a MovieLens vocabulary (the export's vocab.json) it is the
vocabulary's movies, id k of the sorted list at row k + 1 (row 0, the unseen
movies' row, is no item); without one, every row is an item whose id is the
row itself (ids were rows in training). With a learned `vocabulary` on the
item feature (the export's features.json, runtime.features.vocabulary), it is
the vocabulary's kept values, at rows oov_buckets, oov_buckets + 1, ...; each
item's id in the index is its table row, and `item_names` gives the raw value
(the CSV's own string id) that `retrieve` writes for it. The OOV rows are no
items.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from runtime.retrieval.head import item_batch
from runtime.sparse.jagged import KeyedJaggedTensor

__all__ = [
    "catalogue",
    "finish_vectors",
    "item_names",
    "item_request",
    "item_vocabulary",
    "learned_catalogue",
    "row_ids",
]


def item_request(
    rows: torch.Tensor,
    keys: Sequence[str],
    item_feature: str,
    weighted: bool,
    attributes: torch.Tensor | None = None,
    attribute_keys: Sequence[str] = (),
) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor of `keys`: `item_feature` one row per sample, each of `attribute_keys` its
    column of `attributes` [n, A] (none where -1, an attribute not known), every other key empty."""
    batch = item_batch(rows.reshape(-1).long(), keys, item_feature, attributes, attribute_keys)
    weights = torch.ones(batch.values().numel()) if weighted else None
    return KeyedJaggedTensor(list(keys), batch.values(), weights, lengths=batch.lengths())


def finish_vectors(vectors: torch.Tensor, retrieval: Mapping[str, Any]) -> torch.Tensor:
    """float32 vectors, L2-normalised when the head normalises."""
    vectors = vectors.float()
    return F.normalize(vectors, dim=-1) if retrieval["normalize"] else vectors


def catalogue(rows: int, movie_rows: Mapping[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(item table rows, their item ids) of the items an index holds (see the module docstring)."""
    if movie_rows is None:
        every = torch.arange(rows)
        return every, every.clone()
    ids = sorted(movie_rows)
    return torch.tensor([movie_rows[i] for i in ids], dtype=torch.long), torch.tensor(ids, dtype=torch.long)


def item_vocabulary(inputs: Any, item_feature: str) -> Any:
    """The learned vocabulary state of the item feature of `inputs` (with their learned state), or None."""
    if inputs.learned is None or item_feature not in inputs.learned.features:
        return None
    entry = inputs.learned.get(item_feature)
    return entry.state if entry.kind == "vocabulary" else None


def learned_catalogue(state: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(item table rows, their ids: the rows) of a learned vocabulary's kept values (a VocabularyState)."""
    rows = torch.arange(len(state.values), dtype=torch.long) + state.oov_buckets
    return rows, rows.clone()


def item_names(state: Any) -> dict[int, str]:
    """Index id (a table row) -> the raw value it stands for, of a learned vocabulary (a VocabularyState)."""
    return {state.oov_buckets + k: value for k, value in enumerate(state.values)}


def row_ids(rows: torch.Tensor, movie_rows: Mapping[int, int] | None) -> torch.Tensor:
    """The item id of each table row in `rows`; -1 for row 0 of a vocabulary (an unseen movie)."""
    if movie_rows is None:
        return rows.long()
    lookup = torch.full((max(movie_rows.values(), default=0) + 1,), -1, dtype=torch.long)
    for movie, row in movie_rows.items():
        lookup[row] = movie
    rows = rows.long()
    inside = rows < lookup.numel()
    return torch.where(inside, lookup[rows.clamp(max=lookup.numel() - 1)], torch.full_like(rows, -1))
