"""Head losses: each head's loss over its label, combined with the heads' weights.

A generated module describes its heads as a tuple of `HeadConfig`s (runtime.config.heads; its
HEADS constant), which the loss, the metrics, evaluation and prediction read.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from runtime.config.heads import HeadConfig


def head_loss(loss: str, output: torch.Tensor, label: torch.Tensor, probability: bool = False) -> torch.Tensor:
    """Mean loss of one head: `output` holds logits (bce, softmax) or values (mse).

    With `probability`, a bce head's output holds probabilities: torch's BCELoss,
    which clamps each log at -100 so a probability of exactly 0 or 1 costs 100, not inf.
    """
    if loss == "bce" and probability:
        return F.binary_cross_entropy(output, label.to(output.dtype))
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(output, label.to(output.dtype))
    if loss == "mse":
        return F.mse_loss(output, label.to(output.dtype))
    if loss == "softmax":
        return F.cross_entropy(output, label.long())
    raise ValueError(f"unknown loss {loss!r} (expected bce, mse or softmax)")


def _check_probabilities(head: HeadConfig, output: torch.Tensor) -> None:
    low, high = output.detach().aminmax()
    if not (low >= 0 and high <= 1):  # NaN fails too
        raise ValueError(
            f"{head.describe()}: output 'probability' holds values outside [0, 1] "
            f"(min {low.item():.6g}, max {high.item():.6g}); the block it reads must give probabilities"
        )


def total_loss(
    outputs: Mapping[str, torch.Tensor],
    labels: Mapping[str, torch.Tensor],
    heads: Sequence[HeadConfig],
    retrieval: Callable[[Any], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Sum over heads of weight * loss; a missing label names the head and the column.

    A sampled_softmax head reads no label: `retrieval` (the model's) gives its
    loss from its output (runtime.retrieval.head.RetrievalLoss).
    """
    total: torch.Tensor | None = None
    for head in heads:
        if head.loss == "sampled_softmax":
            if retrieval is None:
                raise ValueError(f"{head.describe()}: a sampled_softmax head needs the model's retrieval loss")
            term = head.weight * retrieval(outputs[head.name])
            total = term if total is None else total + term
            continue
        if head.label not in labels:
            raise KeyError(
                f"{head.describe()}: label column {head.label!r} is not in the batch (labels present: {sorted(labels)})"
            )
        output = outputs[head.name]
        if head.probability:
            _check_probabilities(head, output)
        term = head.weight * head_loss(head.loss, output, labels[head.label], head.probability)
        total = term if total is None else total + term
    if total is None:
        raise ValueError("a model needs at least one head to have a loss")
    return total
