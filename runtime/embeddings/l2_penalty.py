"""The L2 penalty on embedding rows, (l2 / 2) * sum ||w_r||^2 over the rows a step looks up.

Why the rows of the batch, not whole tables: FuxiCTR (`embedding_regularizer`,
(lambda / p) * ||W||_p^p added to the loss) and DeepCTR-Torch
(`l2_reg_embedding`, lambda * sum W^2) penalise every row of every table at
every step, which costs O(table) per step and moves rows no sample read; sparse
systems penalise the rows of the batch instead: fbgemm's TBE `weight_decay`
in `WeightDecayMode.L2` adds weight_decay * w_r to the gradient of each row
the batch touches (TorchEasyRec's `FusedRowWiseAdagradOptimizer` with
`weight_decay_mode: L2`), the same term as this one; but fbgemm 1.8's CPU
kernels leave it out (sgd, adagrad and rowwise_adagrad update a row the same
with weight_decay 0.5 as with 0), hence a path of our own for every
optimizer and kernel.

Here each distinct row r a table's lookup reads in the step (over all the
features reading the table, in the global batch: every sharding type looks
rows up where they live, a data_parallel replica the global batch's) adds
(l2 / 2) * ||w_r||^2 to the objective, once however often the batch reads it.
Evaluation and prediction (no gradient) look up the batch alone.

Why inside the lookup: the tables' optimizer runs inside the lookup's
backward (fbgemm's TBE, the C row-wise Adagrad, or the dense kernel's hook),
so a second lookup of the rows for the penalty would step the optimizer a
second time. Instead the group's one lookup call takes U more bags after the
batch's B (`with_penalty_bags`): bag j of the first feature of table t holds
table t's j-th distinct row alone, every other extra bag is empty, so the
extra output block holds exactly the rows, and zeros. `PenaltyGradient`
hands the batch's rows on and, in backward, gives the extra block the
gradient l2 * w_r: the kernel sums it with the batch's gradient of row r and
applies one optimizer step, exactly as for a loss term (l2 / 2) * ||w_r||^2.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PenaltyGradient", "penalized_lookup", "with_penalty_bags"]


def with_penalty_bags(
    values: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
    feature_tables: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[int], int]:
    """The group's batch with one more bag per distinct row of each table (module docstring).

    `offsets` holds T * B + 1 bag boundaries for the T features of
    `feature_tables` (each feature's table index in the group). Returns the
    values, offsets (T * (B + U) + 1), weights (1 for the extra ids), the
    value offset of each feature, and B.
    """
    features = len(feature_tables)
    batch = (offsets.numel() - 1) // features
    bounds = offsets[::batch].tolist() if batch else [0] * (features + 1)
    first = {t: feature_tables.index(t) for t in dict.fromkeys(feature_tables)}
    rows = {
        t: torch.unique(
            torch.cat([values[bounds[f] : bounds[f + 1]] for f, table in enumerate(feature_tables) if table == t])
        )
        for t in first
    }
    extra = max(r.numel() for r in rows.values())
    extra_lengths = offsets.new_zeros(features, extra)
    parts_values, parts_weights, value_offsets = [], [], [0]
    for f, t in enumerate(feature_tables):
        own = values[bounds[f] : bounds[f + 1]]
        added = rows[t] if first[t] == f else own[:0]
        extra_lengths[f, : added.numel()] = 1
        parts_values += [own, added]
        if weights is not None:
            parts_weights += [weights[bounds[f] : bounds[f + 1]], weights.new_ones(added.numel())]
        value_offsets.append(value_offsets[-1] + own.numel() + added.numel())
    lengths = torch.cat([(offsets[1:] - offsets[:-1]).view(features, batch), extra_lengths], dim=1).flatten()
    new_offsets = torch.cat([offsets.new_zeros(1), torch.cumsum(lengths, 0)])
    new_weights = torch.cat(parts_weights) if weights is not None else None
    return torch.cat(parts_values), new_offsets, new_weights, value_offsets, batch


class PenaltyGradient(torch.autograd.Function):
    """The first `batch` rows of a lookup's output; backward adds l2 * rows to the rest (the penalty rows)."""

    @staticmethod
    def forward(ctx: Any, pooled: torch.Tensor, batch: int, l2: float) -> torch.Tensor:  # type: ignore[override]
        ctx.l2, ctx.penalty_rows = l2, pooled[batch:].detach()
        return pooled[:batch].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return torch.cat([grad, ctx.penalty_rows * ctx.l2]), None, None


def penalized_lookup(
    lookup: Any,
    values: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
    feature_tables: list[int],
    l2: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`lookup(values, offsets, weights, value_offsets)` of the batch with its penalty bags: the batch's
    output and the penalty's value (l2 / 2) * sum ||w_r||^2, detached, before this step's update."""
    values, offsets, weights, value_offsets, batch = with_penalty_bags(values, offsets, weights, feature_tables)
    pooled = lookup(values, offsets, weights, value_offsets)
    penalty = pooled[batch:].detach().square().sum() * (l2 / 2)
    return PenaltyGradient.apply(pooled, batch, l2), penalty
