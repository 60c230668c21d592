"""Synthetic batches made from a model's inputs (runtime.config.data), with a signal a model can learn.

Labels come from a fixed hidden model of the same inputs: a linear function
of the dense features plus, for every sparse feature, the mean of a hashed
per-id score. Ids are skewed towards small row numbers (popular ids recur, as
in real logs), so embeddings see repeated rows within a few steps.
Sequence features (a `max_length`) and their timestamps come from
runtime.data.synthetic.sequences, with a label term that only the history
explains; the batch's sparse keys are the sparse features in the spec's
order, then the timestamps features. A retrieval head's item ids carry a
signal of their own (runtime.data.synthetic.retrieval) and it has no label.

Batches are generated globally and sliced per rank, so N ranks together see
exactly the batch one process would: training at any world size is the same
computation.
"""

from __future__ import annotations

from typing import Mapping

import torch

from runtime.config.data import ModelInputs, SparseFeatureConfig
from runtime.data.batch import Batch
from runtime.data.feature_columns import bucketize, derives, read_inputs
from runtime.data.synthetic.retrieval import item_features, plant_preferences, plant_successors
from runtime.data.synthetic.sequences import HISTORY_WEIGHT, DrawnSequence, draw_sequence, history_term
from runtime.sparse.jagged import KeyedJaggedTensor

_MASK32 = 0xFFFFFFFF
_ID_SKEW = 3.0  # ids = floor(rows * u**skew): row 0 is the most popular


def make_batch(
    inputs: ModelInputs,
    batch_size: int,
    step: int,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> Batch:
    """Rank `rank`'s slice of the global batch number `step` (global size `batch_size`)."""
    if batch_size % world_size != 0:
        raise ValueError(f"global batch size {batch_size} does not divide evenly over {world_size} ranks")
    gen = torch.Generator().manual_seed(_mix(seed, step + 1))
    lo = rank * (batch_size // world_size)
    hi = lo + batch_size // world_size

    dense = {f.name: torch.randn(batch_size, f.size, generator=gen) for f in inputs.dense}
    # Sequences draw from a generator of their own: pooled features stay what they were without them.
    sequence_gen = torch.Generator().manual_seed(_mix(seed, -(step + 1)))
    columns: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # key -> lengths, values, weights
    scores, pooled_ids, sequences = [], {}, {}
    positives = item_features(inputs)
    for index, feature in enumerate(read_inputs(inputs).sparse):
        if feature.max_length is not None:
            sequence = draw_sequence(feature, batch_size, _ID_SKEW, sequence_gen)
            if feature.name in positives:
                planted = plant_successors(sequence.ids, sequence.lengths, feature.num_embeddings, sequence_gen)
                sequence = DrawnSequence(sequence.lengths, planted, sequence.times)
            sequences[feature.name] = sequence
            ids_lengths, ids = sequence.lengths, sequence.ids
            bag_weights = _weights(feature, ids.numel(), sequence_gen)
        else:
            rows = feature.num_embeddings
            ids_lengths = _lengths(feature, batch_size, gen)
            total = int(ids_lengths.sum())
            ids = (torch.rand(total, generator=gen, dtype=torch.float64).pow(_ID_SKEW) * rows).long()
            ids.clamp_(max=rows - 1)
            bag_weights = _weights(feature, total, gen)
            if feature.name in positives:
                ids = _plant_preferences(inputs, feature, ids, pooled_ids, gen)
            pooled_ids[feature.name] = ids
        scores.append(_bag_mean(_hash_score(ids, salt=index), ids_lengths))
        columns[feature.name] = (ids_lengths, ids, bag_weights)
    for stamps in inputs.timestamps:
        sequence = sequences[stamps.sequence]
        columns[stamps.name] = (sequence.lengths, sequence.times, torch.ones(sequence.times.numel()))

    columns = _features(inputs, columns, dense)
    history = HISTORY_WEIGHT * history_term(inputs, sequences, pooled_ids, batch_size) if sequences else None
    labels = _labels(inputs, dense, scores, seed, gen, history)
    lengths, values, weights = [], [], []
    for ids_lengths, ids, bag_weights in columns.values():
        offsets = torch.zeros(batch_size + 1, dtype=torch.long)
        torch.cumsum(ids_lengths, 0, out=offsets[1:])
        lengths.append(ids_lengths[lo:hi])
        values.append(ids[offsets[lo] : offsets[hi]])
        weights.append(bag_weights[offsets[lo] : offsets[hi]])
    any_weighted = any(f.weighted for f in inputs.sparse)
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=list(columns),
        values=torch.cat(values) if values else torch.empty(0, dtype=torch.long),
        lengths=torch.cat(lengths) if lengths else torch.empty(0, dtype=torch.long),
        weights=torch.cat(weights) if any_weighted else None,
        stride=hi - lo,
    )
    return Batch(
        dense={name: x[lo:hi] for name, x in dense.items()},
        sparse=sparse,
        labels={name: y[lo:hi] for name, y in labels.items()},
    )


def _features(
    inputs: ModelInputs,
    columns: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    dense: Mapping[str, torch.Tensor],
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The drawn columns as the spec's sparse features (runtime.data.feature_columns), then timestamps."""
    if not derives(inputs):
        return columns
    out = {}
    for feature in inputs.sparse:
        if feature.boundaries:
            ids = bucketize(dense[feature.column][:, feature.column_index], feature.boundaries)
            out[feature.name] = (torch.ones_like(ids), ids, torch.ones(ids.numel()))
        else:
            out[feature.name] = columns[feature.column or feature.name]
    names = {feature.name for feature in inputs.sparse}
    out.update({key: column for key, column in columns.items() if key not in names})
    return out


def _plant_preferences(
    inputs: ModelInputs,
    feature: SparseFeatureConfig,
    ids: torch.Tensor,
    pooled_ids: dict[str, torch.Tensor],
    gen: torch.Generator,
) -> torch.Tensor:
    """A two-tower item feature's ids, preferred by the first one-id feature drawn before it (the user)."""
    users = [
        f.name
        for f in inputs.sparse
        if f.name in pooled_ids and f.max_length is None and f.fixed_ids and f.ids_per_sample == 1
    ]
    if not users or not (feature.fixed_ids and feature.ids_per_sample == 1):
        return ids
    return plant_preferences(ids, pooled_ids[users[0]], feature.num_embeddings, gen)


def _weights(feature: SparseFeatureConfig, total: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(total, generator=gen) if feature.weighted else torch.ones(total)


def _lengths(feature: SparseFeatureConfig, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    n = feature.ids_per_sample
    if feature.fixed_ids:
        return torch.full((batch_size,), n, dtype=torch.long)
    return torch.randint(0, n + 1, (batch_size,), generator=gen)


def _labels(
    inputs: ModelInputs,
    dense: Mapping[str, torch.Tensor],
    sparse_scores: list[torch.Tensor],
    seed: int,
    gen: torch.Generator,
    history: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """One label tensor per head label, from the hidden model (fixed per seed).

    `history` (the sequences' term, runtime.data.synthetic.sequences) adds to
    every head's first logit after the rest is scaled."""
    hidden = torch.Generator().manual_seed(_mix(seed, 0))
    batch_size = next(iter(dense.values())).shape[0] if dense else sparse_scores[0].shape[0]
    labels: dict[str, torch.Tensor] = {}
    for head in inputs.heads:
        if head.loss == "sampled_softmax":
            continue  # its positives are its item feature's ids
        classes = max(head.num_classes, 1)
        logits = torch.zeros(batch_size, classes)
        for x in dense.values():
            w = torch.randn(x.shape[1], classes, generator=hidden) / x.shape[1] ** 0.5
            logits += x @ w
        for score in sparse_scores:
            logits += score[:, None] * torch.randn(1, classes, generator=hidden)
        logits = logits - logits.mean(0)
        if batch_size > 1:  # one sample has no spread to scale by (its std is NaN)
            logits = logits / logits.std(0).clamp(min=1e-6) * 2.0
        if history is not None:
            logits[:, 0] += history
        if head.loss == "bce":
            labels[head.label] = torch.bernoulli(torch.sigmoid(logits[:, 0]), generator=gen)
        elif head.loss == "mse":
            labels[head.label] = logits[:, 0] + 0.1 * torch.randn(batch_size, generator=gen)
        else:
            labels[head.label] = logits.argmax(dim=1)
    return labels


def _hash_score(ids: torch.Tensor, salt: int) -> torch.Tensor:
    """A fixed pseudo-random score in [-1, 1) per (id, salt), vectorised, no tables."""
    h = (ids * 0x9E3779B1 + salt * 0x85EBCA77) & _MASK32
    h = ((h ^ (h >> 15)) * 0x2C1B3C6D) & _MASK32
    h = ((h ^ (h >> 12)) * 0x297A2D39) & _MASK32
    h = h ^ (h >> 15)
    return h.double().div(2.0**31).sub(1.0).float()


def _bag_mean(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    sums = torch.zeros(lengths.numel()).index_add_(0, bag, scores)
    return sums / lengths.clamp(min=1)


def _mix(seed: int, stream: int) -> int:
    """A 63-bit generator seed from (seed, stream), so streams do not overlap."""
    return (seed * 1_000_003 + stream * 7919 + 0x5DEECE66D) % (2**63 - 1)
