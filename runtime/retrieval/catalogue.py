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

Ranking needs the global batch's positives when they are candidates, an
exchange across ranks: training keeps each step's pairs and negatives
(`KeptStep`) and exchanges a window of steps at once.

    >>> step = StepCandidates(model.retrieval_loss)      # training
    >>> kept = [step.kept(output.held_out_pairs())]      # after each step
    >>> [(vectors, ids)] = step.candidates(kept)         # a collective with in-batch negatives
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.retrieval.gather import all_gather, distributed, gather_ids, gather_rows
from runtime.retrieval.head import HeldOut, RetrievalLoss

__all__ = ["Catalogue", "ExactCatalogue", "KeptStep", "StepCandidates"]


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


@dataclass(frozen=True)
class KeptStep:
    """One training step's held-out pairs as its forward computed them, on the CPU: `queries` [n, D],
    positive `ids` [n], `positives` [n, D] as the softmax scores them, and the shared uniform
    `negatives` (ids [S], vectors [S, D]) the step drew, or None."""

    queries: torch.Tensor
    ids: torch.Tensor
    positives: torch.Tensor
    negatives: tuple[torch.Tensor, torch.Tensor] | None


class StepCandidates:
    """A training step's candidates as its forward computed them (see the module docstring).

    Reads `loss.step_negatives`, the shared uniform negatives the loss's last
    training forward looked up; call `kept` after each step, before the next forward.
    """

    kind = "sampled"

    def __init__(self, loss: RetrievalLoss) -> None:
        self.loss = loss
        self.normalize = loss.softmax.config.normalize
        self.in_batch = loss.softmax.config.negatives.in_batch

    def scored(self, vectors: torch.Tensor) -> torch.Tensor:
        """Item vectors of the forward as the softmax scores them (L2-normalised when it normalises)."""
        return F.normalize(vectors, dim=-1) if self.normalize else vectors

    def kept(self, held: HeldOut) -> KeptStep:
        """What ranking the step whose held-out pairs are `held` needs later (on the CPU, copied: the
        update after the forward leaves it alone); call it after each step, before the next forward."""
        negatives = self.loss.step_negatives
        with torch.no_grad():
            return KeptStep(
                held.queries.detach().float().cpu(),
                held.ids.detach().cpu(),
                self.scored(held.positives.detach().float()).cpu().clone(),
                None if negatives is None else (negatives[0].cpu(), negatives[1].float().cpu()),
            )

    def candidates(self, steps: Sequence[KeptStep]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each kept step's (vectors [N, D], distinct ids [N]); one exchange across ranks for all of
        them when the global batch's positives are among the candidates (every rank calls it with
        the same number of steps, each rank its own pairs)."""
        gathered = self._gathered(steps) if any(self.in_batch or step.negatives is None for step in steps) else None
        out = []
        for index, step in enumerate(steps):
            vectors: list[torch.Tensor] = []
            ids: list[torch.Tensor] = []
            if gathered is not None and (self.in_batch or step.negatives is None):
                vectors.append(gathered[index][0])
                ids.append(gathered[index][1])
            if step.negatives is not None:
                ids.append(step.negatives[0])
                vectors.append(step.negatives[1])
            every, rows = torch.cat(ids), torch.cat(vectors)
            distinct, inverse = torch.unique(every, return_inverse=True)
            first = torch.full((distinct.numel(),), every.numel(), dtype=torch.long)
            first.scatter_reduce_(0, inverse, torch.arange(every.numel()), reduce="amin")
            out.append((rows[first], distinct))
        return out

    def _gathered(self, steps: Sequence[KeptStep]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each step's positives (vectors, ids) of every rank, in rank order: the counts of every
        step, then all the steps' rows and ids, each in one all-gather."""
        group = self.loss.process_group
        own = torch.tensor([step.ids.shape[0] for step in steps], dtype=torch.long)
        vectors = torch.cat([step.positives for step in steps])
        ids = torch.cat([step.ids for step in steps])
        if not distributed(group):
            return list(zip(vectors.split(own.tolist()), ids.split(own.tolist()), strict=True))
        assert group is not None
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
        counts = torch.stack(all_gather(own.to(device), group)).cpu()  # [ranks, steps]
        totals = counts.sum(dim=1).tolist()
        with torch.no_grad():
            every_vector = gather_rows(vectors, group, totals)[0].cpu()
        every_id = gather_ids(ids, group, totals).cpu()
        # rank r's rows of step k start at the rows of ranks before r plus r's rows of steps before k
        starts = counts.cumsum(dim=1) - counts + torch.tensor([0, *totals[:-1]]).cumsum(0).unsqueeze(1)
        out = []
        for step in range(len(steps)):
            rows = torch.cat(
                [
                    torch.arange(int(starts[r, step]), int(starts[r, step] + counts[r, step]))
                    for r in range(counts.shape[0])
                ]
            )
            out.append((every_vector[rows], every_id[rows]))
        return out
