"""A model's heads as the runtime reads them: one `HeadConfig` each (a generated module's HEADS).

The loss (runtime.modules.heads.losses), the metrics, evaluation and prediction read
them; torch-free, so the data readers and reporting import it without a model.
"""

from __future__ import annotations

from dataclasses import dataclass

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
