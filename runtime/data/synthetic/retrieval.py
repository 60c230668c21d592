"""Synthetic positives for retrieval heads: item ids a model can predict from the query side.

Part of `runtime.data.synthetic.batches`. A `sampled_softmax` head's positives are the
ids of its item feature (the head's label names it), so the signal is
planted in those ids rather than in a label:

- two-tower (a pooled item feature of one id per sample): with probability
  PREFERENCE the item is the user's preferred item, a fixed hash of the first
  other pooled one-id feature (the user), else the popularity-skewed draw;
- next item (a sequence feature): with probability FOLLOW each position
  after the first holds the successor of the item before it, a fixed
  permutation of the table's rows, else the drawn id.

Either way a popularity ranking stays well below what a model that reads
the user (or the last item) can reach, which the test suite asserts.
"""

from __future__ import annotations

import torch

from runtime.config.data import ModelInputs

PREFERENCE = 0.7  # share of two-tower positives that are the user's preferred item
FOLLOW = 0.7  # share of sequence positions that follow their predecessor
_MASK32 = 0xFFFFFFFF


def item_features(inputs: ModelInputs) -> set[str]:
    """The features whose ids are a retrieval head's positives."""
    return {head.label for head in inputs.heads if head.loss == "sampled_softmax"}


def preferred_item(user_ids: torch.Tensor, rows: int) -> torch.Tensor:
    """Each user's preferred item: a fixed hash of the user id, in [0, rows)."""
    h = (user_ids * 0x9E3779B1 + 0x7F4A7C15) & _MASK32
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & _MASK32
    return (h ^ (h >> 13)) % rows


def successor(ids: torch.Tensor, rows: int) -> torch.Tensor:
    """The item that follows `ids`: an affine permutation of the rows (7 is coprime to rows not divisible by 7)."""
    step = 7 if rows % 7 else 11
    return (ids * step + 3) % rows


def plant_preferences(item_ids: torch.Tensor, user_ids: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """`item_ids` (one per sample) replaced by the user's preferred item with probability PREFERENCE."""
    keep = torch.rand(item_ids.numel(), generator=gen) >= PREFERENCE
    return torch.where(keep, item_ids, preferred_item(user_ids, rows))


def plant_successors(ids: torch.Tensor, lengths: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """A batch of sequences (`ids` [sum], `lengths` [B]) whose positions follow their predecessor at rate FOLLOW."""
    follows = torch.rand(ids.numel(), generator=gen) < FOLLOW
    starts = torch.cumsum(lengths, 0) - lengths
    position = torch.arange(ids.numel()) - torch.repeat_interleave(starts, lengths)
    planted = ids.clone()
    for t in range(1, int(lengths.max()) if lengths.numel() else 0):
        at = torch.nonzero((position == t) & follows).squeeze(1)
        planted[at] = successor(planted[at - 1], rows)
    return planted
