"""What a retrieval head's metrics rank held-out positives against: the whole item table, or a step's candidates.

Evaluation ranks every held-out positive against every row of the item
table (`ExactCatalogue`, the model's `item_catalogue`), all read in one state.

The progress lines of training rank each step's held-out positives against
that step's own candidates, with the vectors the step's forward computed
for them (`StepCandidates`): the step's shared uniform negatives when the
head draws them, and the global batch's held-out positives when the head
has in-batch negatives (or draws no shared negatives: `per_query` alone).
For a two-tower head that is the candidate set its softmax scored. Read at
the log step instead, after the window's updates, every vector mixes
states: an update has just pulled each query's positive towards that query
while candidates it did not touch stay where they were, and a positive
looks found after one step of a model whose loss is still at chance. From
the forward's vectors a model that has learnt nothing ranks at chance
(about k / candidates for recall@k). The figures are over a sample, so
they carry a `sampled_` prefix (`sampled_recall@10`).

    >>> step = StepCandidates(model.retrieval_loss)      # training
    >>> vectors, ids = step.candidates(output.held_out_pairs())  # a collective with in-batch negatives
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.retrieval.gather import gather_ids, gather_rows
from runtime.retrieval.head import HeldOut, RetrievalLoss

__all__ = ["Catalogue", "ExactCatalogue", "StepCandidates"]


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


class StepCandidates:
    """A training step's candidates as its forward computed them (see the module docstring).

    Reads `loss.step_negatives`, the shared uniform negatives the loss's last
    training forward looked up; call `candidates` after each step, before the next forward.
    """

    kind = "sampled"

    def __init__(self, loss: RetrievalLoss) -> None:
        self.loss = loss
        self.normalize = loss.softmax.config.normalize
        self.in_batch = loss.softmax.config.negatives.in_batch

    def scored(self, vectors: torch.Tensor) -> torch.Tensor:
        """Item vectors of the forward as the softmax scores them (L2-normalised when it normalises)."""
        return F.normalize(vectors, dim=-1) if self.normalize else vectors

    def candidates(self, held: HeldOut) -> tuple[torch.Tensor, torch.Tensor]:
        """(vectors [N, D], distinct ids [N]) of the step whose held-out pairs are `held` (every rank's
        own); a collective when the global batch's positives are among them."""
        vectors: list[torch.Tensor] = []
        ids: list[torch.Tensor] = []
        negatives = self.loss.step_negatives
        if self.in_batch or negatives is None:
            group = self.loss.process_group
            with torch.no_grad():
                vectors.append(gather_rows(self.scored(held.positives.detach().float()), group)[0].cpu())
            ids.append(gather_ids(held.ids.detach(), group).cpu())
        if negatives is not None:
            ids.append(negatives[0].cpu())
            vectors.append(negatives[1].float().cpu())
        every, rows = torch.cat(ids), torch.cat(vectors)
        distinct, inverse = torch.unique(every, return_inverse=True)
        first = torch.full((distinct.numel(),), every.numel(), dtype=torch.long)
        first.scatter_reduce_(0, inverse, torch.arange(every.numel()), reduce="amin")
        return rows[first], distinct
