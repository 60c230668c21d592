"""A compiled retrieval head: what its forward gives, its loss, and the item batches it looks up.

A generated module's `sampled_softmax` head returns a `RetrievalOutput`
from forward: the query vectors, the vectors of their positive items (the
item tower on the batch's item ids, or the ids' rows) and those ids; with
`item_attributes`, also each positive's attribute ids [b, A], which the
loss records in the item catalogue (runtime.retrieval.item_attributes)
before it looks the step's negatives up.

    two-tower   query [b, D], positive [b, D], ids [b]
    next item   query [b, L, D] (a sequence block's output), positive
                [b, L, D] (the rows of the sequence itself), ids [b, L]
                (-1 after each sequence): position t's query predicts the
                item at t + 1

`RetrievalLoss` is the head's loss: the pairs (every position t < len - 1 of
a sequence) go through runtime.retrieval.sampled_softmax, and the step's
uniform negatives through the model's `item_vectors`, the same sharded
lookup as the positives. Its value is normalised by the GLOBAL number of
pairs, so that N ranks (whose losses the gradients average) train what one
process does even when the ranks hold different numbers of positions.

    >>> output = two_tower_output(query, item, ids)      # in the generated forward
    >>> loss = model.retrieval_loss(output, model.item_vectors)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist
from torch import nn

from runtime.config.retrieval import SampledSoftmaxConfig
from runtime.retrieval.gather import PaddedCounts, distributed, gather_rows, row_counts
from runtime.retrieval.item_attributes import ItemAttributes
from runtime.retrieval.sampled_softmax import SampledSoftmaxLoss
from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor

__all__ = [
    "HeldOut",
    "RetrievalLoss",
    "RetrievalOutput",
    "catalogue_vectors",
    "item_batch",
    "last_positions",
    "next_item_output",
    "padded_ids",
    "two_tower_output",
]

ItemVectors = Callable[[torch.Tensor], torch.Tensor]


class HeldOut(NamedTuple):
    """The held-out pairs a retrieval head's metrics rank (RetrievalOutput.held_out_pairs)."""

    queries: torch.Tensor  # [n, D]
    ids: torch.Tensor  # [n] the positives' ids
    positives: torch.Tensor  # [n, D] the positives' vectors as the forward computed them
    history: torch.Tensor  # [n, S] the items before each positive, -1 padded (S = 0: two-tower)
    samples: torch.Tensor  # [n] the sample each query is of


@dataclass(frozen=True)
class RetrievalOutput:
    """A retrieval head's forward output (see the module docstring for the shapes)."""

    query: torch.Tensor
    positive: torch.Tensor
    ids: torch.Tensor
    attributes: torch.Tensor | None = None  # [b, A]: each positive's attribute ids (item_attributes)

    @property
    def next_item(self) -> bool:
        return self.query.dim() == 3

    def detach(self) -> RetrievalOutput:
        return RetrievalOutput(self.query.detach(), self.positive.detach(), self.ids, self.attributes)

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(queries [n, D], their positives' vectors [n, D], ids [n]): every training pair."""
        if not self.next_item:
            return self.query, self.positive, self.ids
        following = self.ids[:, 1:] >= 0  # position t has a next item
        return self.query[:, :-1][following], self.positive[:, 1:][following], self.ids[:, 1:][following]

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries [n, D], positive ids [n]) to rank: a sequence's last item, predicted from the rest.

        Two-tower: every query with its positive. Next item: the query at
        position len - 2 and the item at len - 1, for sequences of two items or more.
        """
        held = self.held_out_pairs()
        return held.queries, held.ids

    def held_out_pairs(self) -> HeldOut:
        """`held_out`'s queries and positive ids, the positives' vectors as this forward computed
        them [n, D], each query's history (the items before the positive, [n, S] with -1 padding;
        S = 0 for a two-tower head, whose query has none) and the sample each query is of [n]."""
        if not self.next_item:
            samples = torch.arange(self.ids.shape[0], device=self.ids.device)
            return HeldOut(self.query, self.ids, self.positive, self.ids.new_full((self.ids.shape[0], 0), -1), samples)
        lengths = (self.ids >= 0).sum(dim=1)
        keep = lengths >= 2
        rows = torch.arange(self.ids.shape[0], device=self.ids.device)[keep]
        last = lengths[keep] - 1
        history = self.ids[keep, :-1]
        history = history.masked_fill(torch.arange(history.shape[1], device=history.device) >= last.unsqueeze(1), -1)
        return HeldOut(self.query[rows, last - 1], self.ids[rows, last], self.positive[rows, last], history, rows)


def two_tower_output(
    query: torch.Tensor, item: torch.Tensor, ids: JaggedTensor, *attributes: JaggedTensor
) -> RetrievalOutput:
    """The head's output for vector queries; `ids` must hold exactly one item id per sample, and so
    must each of the item's `attributes` (the features of the spec's item_attributes, in order)."""
    for values, what in ((ids, "item ids"), *((attribute, "ids of an item attribute") for attribute in attributes)):
        lengths = values.lengths()
        if lengths.numel() and bool((lengths != 1).any()):
            sample = int(torch.nonzero(lengths != 1)[0, 0])
            raise ValueError(
                f"retrieval head: sample {sample} has {int(lengths[sample])} {what}; the feature needs exactly one"
            )
    columns = [attribute.values().to(torch.long) for attribute in attributes]
    return RetrievalOutput(query, item, ids.values().to(torch.long), torch.stack(columns, dim=1) if columns else None)


def padded_ids(ids: JaggedTensor, length: int) -> torch.Tensor:
    """A sequence's ids [sum(L)] with lengths [B] -> [B, length] int64, -1 after each sequence."""
    lengths = ids.lengths()
    padded = torch.full((lengths.numel(), length), -1, dtype=torch.long, device=lengths.device)
    positions = torch.arange(length, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    padded[positions] = ids.values().to(torch.long)
    return padded


def next_item_output(query: torch.Tensor, item: torch.Tensor, ids: JaggedTensor) -> RetrievalOutput:
    """The head's output for a sequence query over the item sequence `item` [B, L, D] with its `ids`."""
    return RetrievalOutput(query, item, padded_ids(ids, item.shape[1]))


def last_positions(sequence: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, L, D] padded -> [B, D]: each sequence's last real position (position 0 for an empty one)."""
    rows = torch.arange(sequence.shape[0], device=sequence.device)
    return sequence[rows, (lengths.to(sequence.device) - 1).clamp(min=0)]


def item_batch(
    ids: torch.Tensor,
    keys: Sequence[str],
    feature: str,
    attributes: torch.Tensor | None = None,
    attribute_keys: Sequence[str] = (),
) -> KeyedJaggedTensor:
    """A batch of `ids.numel()` samples: `feature` (when among `keys`) holds one id each; each of
    `attribute_keys` among `keys` holds its column of `attributes` [n, A] (no id where -1: an unknown
    attribute); every other key of `keys` none."""
    n = ids.numel()
    lengths = torch.zeros(len(keys), n, dtype=torch.long, device=ids.device)
    values = []
    for index, key in enumerate(keys):  # values are key-major, as the lengths are
        if key == feature:
            lengths[index] = 1
            values.append(ids.reshape(-1).to(torch.long))
        elif key in attribute_keys:
            assert attributes is not None
            column = attributes[:, list(attribute_keys).index(key)].to(ids.device)
            lengths[index] = (column >= 0).long()
            values.append(column[column >= 0])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys),
        values=torch.cat(values) if values else ids.new_zeros(0, dtype=torch.long),
        lengths=lengths.reshape(-1),
        stride=n,
    )


@torch.no_grad()
def catalogue_vectors(item_vectors: ItemVectors, num_items: int, chunk: int = 1 << 14) -> torch.Tensor:
    """The item vectors [num_items, D] of every row of the item table, `chunk` ids at a time."""
    parts = [
        item_vectors(torch.arange(start, min(start + chunk, num_items), dtype=torch.long))
        for start in range(0, num_items, chunk)
    ]
    return torch.cat(parts)


class RetrievalLoss(nn.Module):
    """The sampled softmax of one retrieval head, normalised by the global number of pairs.

    Holds the SampledSoftmaxLoss (its step counter and logQ state are buffers,
    so checkpoints carry them). `forward(output, item_vectors)` draws the
    step's uniform negatives and looks them up with `item_vectors` (a
    collective at world size > 1: every rank draws the same ids). Given
    `attributes` (the model's item catalogue, when its item tower reads
    attributes), a training forward first records the global batch's items
    and their attributes there, so the negatives' vectors are computed from them.
    """

    def __init__(self, config: SampledSoftmaxConfig, process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.softmax = SampledSoftmaxLoss(config, process_group=process_group)
        self.process_group = process_group
        # Pairs trained on by every rank so far (the counts are exchanged anyway): a run that ends
        # with none learnt nothing (every history too short), and the worker says so.
        self.pairs_trained = 0
        # (ids [S], detached vectors [S, D]) of the last training forward's shared uniform negatives, or
        # None: the candidates training's metrics rank against (runtime.retrieval.catalogue.StepCandidates).
        self.step_negatives: tuple[torch.Tensor, torch.Tensor] | None = None
        # The largest rank's pair count at the last forward, the same on every rank (None before the
        # first): where the candidates' gather comes first, each rank pads its rows to it and sends its
        # count beside them, which spares the counts' own exchange (runtime.retrieval.gather.PaddedCounts).
        self.last_largest: int | None = None

    def forward(
        self, output: RetrievalOutput, item_vectors: ItemVectors, attributes: ItemAttributes | None = None
    ) -> torch.Tensor:
        query, positive, ids = output.pairs()
        recording = self.training and attributes is not None and output.attributes is not None
        learnt: PaddedCounts | None = None
        if not distributed(self.process_group):
            counts = [ids.numel()]
        elif self.last_largest is not None and not recording and self.softmax.learns_counts():
            learnt = PaddedCounts(self.last_largest)  # the candidates' gather brings the counts
            counts = []
        else:  # one exchange of the ranks' pair counts serves the normalisation, the gathers and per-query negatives
            counts = row_counts(ids.numel(), self.process_group)
        if recording:
            assert attributes is not None and output.attributes is not None
            self._record(attributes, ids, output.attributes, counts)
        if self.softmax.config.negatives.per_query:
            negatives = self._per_query_negatives(ids, counts, item_vectors)
        else:
            negative_ids = self.softmax.negative_ids(ids.device)
            negatives = None if negative_ids is None else item_vectors(negative_ids)
            if self.training:
                drawn = None if negative_ids is None or negatives is None else (negative_ids, negatives.detach())
                self.step_negatives = drawn
        # A summed loss: in-batch negatives alone then take the blocked path (runtime/retrieval/blocked_softmax.py).
        total = self.softmax(query, positive, ids, negatives, reduction="sum", row_counts=learnt or counts)
        if learnt is not None:
            assert learnt.counts is not None  # filled by the gather
            counts = learnt.counts
        self.last_largest = max(counts)
        if self.training:
            self.pairs_trained += sum(counts)
        return total * (len(counts) / max(1.0, float(sum(counts))))

    def _record(
        self, catalogue: ItemAttributes, ids: torch.Tensor, attributes: torch.Tensor, counts: list[int]
    ) -> None:
        """Every rank's rows (item id, attribute ids), in rank order, into the item catalogue."""
        rows = torch.cat([ids.reshape(-1, 1), attributes.to(ids.device)], dim=1)
        with torch.no_grad():
            rows, _ = gather_rows(rows, self.process_group, counts)
        catalogue.record(rows[:, 0], rows[:, 1:])

    def _per_query_negatives(self, ids: torch.Tensor, counts: list[int], item_vectors: ItemVectors) -> torch.Tensor:
        """[n, S, D]: the vectors of this rank's queries' own negatives. Every rank looks up as many ids
        (its rows padded to the largest rank's), as the sharded lookup's exchange needs."""
        first = sum(counts[: dist.get_rank(self.process_group)]) if len(counts) > 1 else 0
        own = self.softmax.negative_ids(ids.device, slice(first, first + ids.numel()), sum(counts))
        assert own is not None
        padded = torch.full(
            (max(counts), own.shape[1]), self.softmax.config.first_id, dtype=own.dtype, device=own.device
        )
        padded[: own.shape[0]] = own
        vectors = item_vectors(padded.reshape(-1))
        return vectors.view(*padded.shape, -1)[: own.shape[0]]
