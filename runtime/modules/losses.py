"""Head losses: each head's loss over its label, combined with the heads' weights."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F


def head_loss(loss: str, output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Mean loss of one head: `output` holds logits (bce, softmax) or values (mse)."""
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(output, label.to(output.dtype))
    if loss == "mse":
        return F.mse_loss(output, label.to(output.dtype))
    if loss == "softmax":
        return F.cross_entropy(output, label.long())
    raise ValueError(f"unknown loss {loss!r} (expected bce, mse or softmax)")


def total_loss(
    outputs: Mapping[str, torch.Tensor],
    labels: Mapping[str, torch.Tensor],
    heads: Sequence[Mapping[str, Any]],
) -> torch.Tensor:
    """Sum over heads of weight * loss; a missing label names the head and the column."""
    total: torch.Tensor | None = None
    for head in heads:
        if head["label"] not in labels:
            raise KeyError(
                f"head {head['name']!r}: label column {head['label']!r} is not in the batch "
                f"(labels present: {sorted(labels)})"
            )
        term = head["weight"] * head_loss(head["loss"], outputs[head["name"]], labels[head["label"]])
        total = term if total is None else total + term
    if total is None:
        raise ValueError("a model needs at least one head to have a loss")
    return total
