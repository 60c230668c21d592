"""Head losses: each head's loss over its label, combined with the heads' weights.

A generated module describes its heads as a tuple of `HeadConfig`s (its
HEADS constant), which the loss, the metrics, evaluation and prediction read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

LOSSES = ("bce", "mse", "softmax", "sampled_softmax")
OUTPUTS = ("logit", "probability")  # what a bce head's output holds


@dataclass(frozen=True, slots=True)
class HeadConfig:
    """One prediction head: `loss` of output `name` against label column `label`, times `weight`.

    `metrics` are the ones reported for it (empty: the loss's defaults);
    `where` is the spec location it was compiled from, named in errors.
    `output`: a bce head's output is a `logit` or already a `probability`
    (ESMM's p(ctr) x p(cvr)); loss, metrics and prediction read it as such.
    """

    name: str
    loss: str
    label: str
    weight: float = 1.0
    num_classes: int = 1
    metrics: tuple[str, ...] = ()
    where: str = ""
    output: str = "logit"
    mask_seen: bool = True  # a next-item head's metrics: a held-out row's history items are no candidates

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", tuple(self.metrics))
        if self.loss not in LOSSES:
            raise ValueError(
                f"{self.describe()}: unknown loss {self.loss!r} (expected bce, mse, softmax or sampled_softmax)"
            )
        if self.output not in OUTPUTS or (self.output == "probability" and self.loss != "bce"):
            raise ValueError(
                f"{self.describe()}: output {self.output!r} does not fit loss {self.loss!r} "
                "(a bce head's output is 'logit' or 'probability', any other head's 'logit')"
            )

    @property
    def probability(self) -> bool:
        """Whether the output is a probability (a bce head with output 'probability')."""
        return self.output == "probability"

    def describe(self) -> str:
        """`head 'click'`, with its spec location when known."""
        return f"head {self.name!r}" + (f" ({self.where})" if self.where else "")


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
                f"{head.describe()}: label column {head.label!r} is not in the batch "
                f"(labels present: {sorted(labels)})"
            )
        output = outputs[head.name]
        if head.probability:
            _check_probabilities(head, output)
        term = head.weight * head_loss(head.loss, output, labels[head.label], head.probability)
        total = term if total is None else total + term
    if total is None:
        raise ValueError("a model needs at least one head to have a loss")
    return total
