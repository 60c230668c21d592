"""What a retrieval head's metrics rank held-out positives against: the whole item table, or a sample.

Evaluation ranks every held-out positive against every row of the item
table (`ExactCatalogue`, the model's `item_catalogue`). The progress lines of
training rank the window's queries at every log step, and there the whole
table costs the item tower over every row plus a [queries, rows] score
matrix: for a table of 1,048,576 items and a window of ten 1,024-sample
steps, over a TFLOP, far more than the ten steps themselves. So training
ranks against the whole table only when it has at most `TRAINING_CANDIDATES`
rows (`training_catalogue`), and otherwise against `SampledCatalogue`: the
distinct ids among `TRAINING_CANDIDATES` uniform draws from the table, fresh at
each log step and the same on every rank, with each positive's own vector
from the same item tower. The metrics then carry a `sampled_` prefix
(`sampled_recall@10`), so no line passes them off as the exact figures.

Training reads the catalogue after the window's updates, and an update has
just pulled each query's positive towards that query: ranked against its
updated vector, a positive looks found after one step of a model whose loss
is still at chance. So `training_catalogue` returns a `StepPositives`
catalogue: each positive scores with the vector the step's forward used
(`RetrievalOutput.positive`, normalised like the catalogue), and the other
candidates are read at the log step. Dense layers of an item tower move
every candidate at each update too, so early in training the figure can sit
a little below chance rather than above it; evaluation reads one state.

    >>> catalogue = training_catalogue(model.item_vectors, model.item_catalogue, num_items=1 << 20)
    >>> vectors, ids, positives = catalogue.candidates(window_ids, process_group)  # a collective
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.retrieval.gather import gather_ids
from runtime.retrieval.sampling import uniform_negatives

__all__ = [
    "TRAINING_CANDIDATES",
    "Catalogue",
    "ExactCatalogue",
    "SampledCatalogue",
    "StepPositives",
    "training_catalogue",
]

TRAINING_CANDIDATES = 2048
SAMPLE_SEED = 0x5EED


class Catalogue(Protocol):
    """The candidates of a ranking: `kind` ('exact' or 'sampled') names the metrics."""

    kind: str

    def candidates(
        self, positive_ids: torch.Tensor, process_group: dist.ProcessGroup | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(candidate vectors [N, D], their ids [N] or None for rows 0..N-1, the vectors of
        `positive_ids` [n, D]); a collective: every rank calls it, with its own positives."""
        ...


class ExactCatalogue:
    """Every row of the item table, from the model's `item_catalogue()`."""

    kind = "exact"

    def __init__(self, item_catalogue: Callable[[], torch.Tensor]) -> None:
        self.item_catalogue = item_catalogue

    def candidates(
        self, positive_ids: torch.Tensor, process_group: dist.ProcessGroup | None
    ) -> tuple[torch.Tensor, None, torch.Tensor]:
        vectors = self.item_catalogue().detach().float().cpu()
        return vectors, None, vectors[positive_ids.cpu()]


class SampledCatalogue:
    """`size` uniform draws from rows [0, num_items) per call (the distinct ones), seeded by the call's
    number, so every rank ranks against the same items; `item_vectors(ids)` is the model's (a collective)."""

    kind = "sampled"

    def __init__(self, item_vectors: Callable[[torch.Tensor], torch.Tensor], num_items: int, size: int) -> None:
        self.item_vectors = item_vectors
        self.num_items = num_items
        self.size = size
        self.calls = 0

    def candidates(
        self, positive_ids: torch.Tensor, process_group: dist.ProcessGroup | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sample = uniform_negatives(SAMPLE_SEED, self.calls, self.size, self.num_items)
        self.calls += 1
        # One lookup of ids every rank agrees on: the sample and every rank's positives.
        everyone = gather_ids(positive_ids.cpu().to(torch.long), process_group)
        ids = torch.unique(torch.cat([sample, everyone]))
        with torch.no_grad():
            vectors = self.item_vectors(ids).detach().float().cpu()
        drawn = torch.unique(sample)
        return vectors[torch.searchsorted(ids, drawn)], drawn, vectors[torch.searchsorted(ids, positive_ids.cpu())]


class StepPositives:
    """`inner`'s candidates, with each positive's vector taken from the step's forward (see the module docstring)."""

    def __init__(self, inner: Catalogue, normalize: bool) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.normalize = normalize

    def candidates(
        self, positive_ids: torch.Tensor, process_group: dist.ProcessGroup | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        return self.inner.candidates(positive_ids, process_group)

    def forward_positives(self, vectors: torch.Tensor) -> torch.Tensor:
        """The forward's positive vectors [n, D] as the catalogue scores them (L2-normalised when it is)."""
        return F.normalize(vectors, dim=-1) if self.normalize else vectors


def training_catalogue(
    item_vectors: Callable[[torch.Tensor], torch.Tensor],
    item_catalogue: Callable[[], torch.Tensor],
    num_items: int,
    size: int = TRAINING_CANDIDATES,
    normalize: bool = False,
) -> StepPositives:
    """What the log steps of training rank against: the whole table up to `size` rows, else a sample;
    positives score with the step's vectors. `normalize`: the head L2-normalises its vectors."""
    inner: Catalogue = ExactCatalogue(item_catalogue) if num_items <= size else SampledCatalogue(item_vectors, num_items, size)
    return StepPositives(inner, normalize)
