"""Synthetic sequence features and their timestamps, with a signal in the history.

Part of `runtime.data.synthetic.batches`: it draws the sequence features of a batch
(0 to `max_length` ids per sample), their timestamps and the term of the
labels that only the history explains.

Every id of a table has a latent class, 0 or 1: a hash of the id and the
table's name, so features sharing a table agree on it. A sample's history is
drawn around a taste class: each position holds an id of the taste with
probability PURITY, else one of the other class (ids skewed towards small
rows within a class, as pooled ids are). A sequence's label term is +1 when
the majority class of the history agrees with the class of its target item,
-1 when not, 0 for an empty or tied history. The target is the first pooled
feature of one id per sample that shares the sequence's table (DIN's
target item); without one the term is +1 for a class-1 majority, -1 for a
class-0 one. Labels add HISTORY_WEIGHT times the mean term over sequences,
so a model that compares history and target lowers the loss well below a
constant predictor's.

Timestamps are int64 seconds, strictly increasing along each sample's
sequence: a start in 2017-2020 plus gaps of one second to thirty days.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from runtime.config.data import ModelInputs, SparseFeatureConfig

PURITY = 0.8  # the share of a history's positions drawn from the sample's taste class
HISTORY_WEIGHT = 3.0  # the label logit's weight on the history term
_TRIES = 12  # candidate ids per position; one of the wanted class is found but once in 4096
_START = 1_500_000_000  # 2017-07-14, unix seconds
_START_SPREAD = 100_000_000
_MAX_GAP = 30 * 86_400
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class DrawnSequence:
    """One sequence feature of the whole global batch: lengths [B], ids and their times [sum]."""

    lengths: torch.Tensor
    ids: torch.Tensor
    times: torch.Tensor


def draw_sequence(feature: SparseFeatureConfig, batch_size: int, skew: float, gen: torch.Generator) -> DrawnSequence:
    """The histories of `feature` (0 to max_length ids each) around a random taste per sample."""
    if feature.max_length is None:
        raise ValueError(f"feature {feature.name!r} is pooled, not a sequence (it has no max_length)")
    lengths = torch.randint(0, feature.max_length + 1, (batch_size,), generator=gen)
    total = int(lengths.sum())
    taste = torch.randint(0, 2, (batch_size,), generator=gen)
    flip = (torch.rand(total, generator=gen) >= PURITY).long()
    wanted = torch.repeat_interleave(taste, lengths) ^ flip
    rows = feature.num_embeddings
    candidates = (torch.rand(total, _TRIES, generator=gen, dtype=torch.float64).pow(skew) * rows).long()
    candidates.clamp_(max=rows - 1)
    hits = latent_class(candidates, feature.table) == wanted[:, None]
    first = hits.long().argmax(dim=1)  # the first candidate of the wanted class (0 when none is)
    ids = candidates.gather(1, first[:, None]).squeeze(1)
    return DrawnSequence(lengths, ids, _times(lengths, gen))


def _times(lengths: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    starts = _START + torch.randint(0, _START_SPREAD, (lengths.numel(),), generator=gen)
    gaps = torch.randint(1, _MAX_GAP + 1, (int(lengths.sum()),), generator=gen)
    running = torch.cumsum(gaps, 0)
    before = torch.cumsum(lengths, 0) - lengths  # values ahead of each sample
    running_before = torch.cat([torch.zeros(1, dtype=torch.long), running])[before]
    bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    return starts[bag] + running[: bag.numel()] - running_before[bag]


def latent_class(ids: torch.Tensor, table: str) -> torch.Tensor:
    """Each id's class (0 or 1) in `table`, a fixed hash of the id and the table's name."""
    salt = zlib.crc32(table.encode())
    h = (ids * 0x9E3779B1 + salt * 0x85EBCA77) & _MASK32
    h = ((h ^ (h >> 16)) * 0x7FEB352D) & _MASK32
    h = ((h ^ (h >> 15)) * 0x846CA68B) & _MASK32
    return (h ^ (h >> 16)) & 1


def history_term(
    inputs: ModelInputs,
    sequences: dict[str, DrawnSequence],
    pooled_ids: dict[str, torch.Tensor],
    batch_size: int,
) -> torch.Tensor:
    """The mean over sequence features of each sample's history term (see the module docstring)."""
    term = torch.zeros(batch_size)
    for name, sequence in sequences.items():
        feature = next(f for f in inputs.sparse if f.name == name)
        classes = latent_class(sequence.ids, feature.table)
        bag = torch.repeat_interleave(torch.arange(batch_size), sequence.lengths)
        ones = torch.zeros(batch_size, dtype=torch.long).index_add_(0, bag, classes)
        majority = torch.sign(2 * ones - sequence.lengths).float()  # +1: class 1, -1: class 0, 0: tie
        target = _target(inputs, feature)
        if target is not None:
            majority = majority * (2 * latent_class(pooled_ids[target.name], feature.table) - 1).float()
        term += majority
    return term / max(len(sequences), 1)


def _target(inputs: ModelInputs, sequence: SparseFeatureConfig) -> SparseFeatureConfig | None:
    for feature in inputs.sparse:
        pooled_single = feature.max_length is None and feature.fixed_ids and feature.ids_per_sample == 1
        if pooled_single and feature.table == sequence.table:
            return feature
    return None
