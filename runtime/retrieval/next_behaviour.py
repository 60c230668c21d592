"""DIEN's auxiliary next-behaviour loss as a compiled model's loss term (a `gru` block's `aux_loss`).

runtime.modules.blocks.dien_auxiliary holds the authors' auxiliary network
and the loss of one batch; this module wires them into a generated model the
way RetrievalLoss wires a sampled softmax: the forward returns what the term
needs, and the model's `loss` adds the term, so evaluation, prediction and
export (which never call `loss`, and whose graphs have no such output) never
build or run the auxiliary network.

    forward   outputs['interests.aux_loss'] = next_behaviour_inputs(%interests, %sequence_history, %history_lengths)
    loss      total_loss(...) + self.interests_aux_loss(outputs['interests.aux_loss'], self.interests_item_rows)

The negatives are the history table's rows of ids drawn per position:
every rank draws the step's [global batch, max_length] ids from one
generator seeded by (seed, step) and keeps its own samples' rows
(runtime.retrieval.sampling.per_query_negatives), so a sample gets the same
negatives on whichever rank it lands and N ranks train what one process
does. Only the ids at positions 1 .. length - 1 (the next behaviours a state
is scored against) are looked up, through the model's sharded table
(`item_rows`, a collective at world size > 1), so the lookup reads no row
the loss gives no gradient (a row read by Adam moves even with a zero gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from runtime.config.retrieval import NextBehaviourConfig
from runtime.modules.blocks.dien_auxiliary import AuxiliaryNet, auxiliary_loss
from runtime.retrieval.gather import distributed
from runtime.retrieval.sampling import per_query_negatives
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.sparse.sequence import padding_mask, to_padded

__all__ = ["NextBehaviourInputs", "NextBehaviourLoss", "negative_batch", "next_behaviour_inputs", "output_key"]

ItemRows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class NextBehaviourInputs:
    """What the forward gives the loss: the extractor's states [B, L, H], the history's rows [B, L, D]
    (the clicked next items) and its lengths [B]."""

    states: torch.Tensor
    items: torch.Tensor
    lengths: torch.Tensor

    def detach(self) -> NextBehaviourInputs:
        return NextBehaviourInputs(self.states.detach(), self.items.detach(), self.lengths)


def output_key(block: str) -> str:
    """The forward's output holding `block`'s NextBehaviourInputs (a head's name has no dot)."""
    return f"{block}.aux_loss"


def next_behaviour_inputs(states: torch.Tensor, items: torch.Tensor, lengths: torch.Tensor) -> NextBehaviourInputs:
    """The forward graph's output for a `gru` block with `aux_loss`."""
    return NextBehaviourInputs(states, items, lengths)


def negative_batch(ids: torch.Tensor, lengths: torch.Tensor, keys: Sequence[str], feature: str) -> KeyedJaggedTensor:
    """A batch of ids.shape[0] samples whose `feature` holds ids[b, 1 : lengths[b]] (none for a history
    of one item or none); every other key of `keys` holds nothing."""
    batch = ids.shape[0]
    following = (lengths - 1).clamp(min=0)
    kept = padding_mask(following, ids.shape[1] - 1)
    key_lengths = torch.zeros(len(keys), batch, dtype=torch.long, device=ids.device)
    key_lengths[list(keys).index(feature)] = following
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys), values=ids[:, 1:][kept].to(torch.long), lengths=key_lengths.reshape(-1), stride=batch
    )


class NextBehaviourLoss(nn.Module):
    """weight * DIEN's auxiliary loss of a batch (runtime.modules.blocks.dien_auxiliary.auxiliary_loss).

    Holds the auxiliary network (dense parameters, trained by the dense
    optimizer) and the step counter of the negatives' draw (a buffer, so a
    resumed run draws what the interrupted one would have).
    """

    step: torch.Tensor

    def __init__(
        self, config: NextBehaviourConfig, hidden_size: int, item_dim: int, process_group: dist.ProcessGroup | None
    ) -> None:
        super().__init__()
        self.config = config
        self.net = AuxiliaryNet(hidden_size, item_dim)
        self.process_group = process_group
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def negative_ids(self, batch: int, device: torch.device) -> torch.Tensor:
        """[batch, max_length]: this rank's rows of the step's per-position draw (ranks hold equal shares)."""
        rank, world = 0, 1
        if distributed(self.process_group):
            rank, world = dist.get_rank(self.process_group), dist.get_world_size(self.process_group)
        c = self.config
        rows = slice(rank * batch, (rank + 1) * batch)
        return per_query_negatives(c.seed, int(self.step), rows, world * batch, c.max_length, c.num_items, 0, device)

    def forward(self, inputs: NextBehaviourInputs, item_rows: ItemRows) -> torch.Tensor:
        states, items, lengths = inputs.states, inputs.items, inputs.lengths
        batch, length, _ = items.shape
        ids = self.negative_ids(batch, items.device)[:, :length]
        following = (lengths - 1).clamp(min=0)
        rows = to_padded(item_rows(ids, lengths), following, length - 1)  # row j: position j + 1's negative
        negatives = torch.cat([rows.new_zeros(batch, 1, rows.shape[2]), rows], dim=1)
        term = auxiliary_loss(self.net, states, items, negatives, lengths, self.config.max_length)
        if self.training:
            self.step += 1
        return self.config.weight * term

    def extra_repr(self) -> str:
        c = self.config
        return f"weight={c.weight}, num_items={c.num_items}, max_length={c.max_length}"
