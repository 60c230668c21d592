"""Reduce-on-plateau: the learning-rate factor an evaluation metric lowers when it stops improving.

FuxiCTR and the BARS benchmarks train every CTR model with it: after each
evaluation pass, when the chosen metric has not improved on its best for
more than `patience` passes in a row, every learning rate (the dense
optimizer's and each embedding table's) is multiplied by `factor`, down to
`min_factor` times its base rate. The decisions are those of
torch.optim.lr_scheduler.ReduceLROnPlateau (threshold_mode "rel", no
cooldown) fed the same metric sequence (for a negative best, the threshold
is relative to its magnitude, where torch's would loosen it); they act on one factor common to all
rates rather than on each rate, so per-table optimizers keep their ratios.

The factor depends on the metrics seen, not on the step, so it is part of a
checkpoint: `state_dict()` keeps the best value, the passes without a gain
and the factor, and a resumed run goes on with the rates the uninterrupted
one would have. On N ranks every rank sees rank 0's evaluation metrics
(runtime.reporting.metrics.agreed), so every rank takes the same decision.

    >>> from runtime.train.early_stopping import BestMetric
    >>> plateau = LrPlateau(BestMetric("click", "auc"), factor=0.1, patience=1)
    >>> [plateau.observe({"click": {"auc": auc}}) for auc in (0.7, 0.8, 0.79, 0.78, 0.77)]
    [1.0, 1.0, 1.0, 0.1, 0.1]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runtime.config.heads import HeadConfig
from runtime.config.training import PlateauConfig
from runtime.train.early_stopping import BestMetric, Metrics, missed_evaluation, resolve_best_metric
from runtime.train.options import UsageError

__all__ = ["LrPlateau", "plateau_from_spec"]

_EPS = 1e-8  # torch's: a reduction smaller than this is skipped


class LrPlateau:
    """The reduce-on-plateau factor of `metric`; `higher_is_better` None takes the metric's own."""

    def __init__(
        self,
        metric: BestMetric,
        *,
        factor: float = 0.1,
        patience: int = 1,
        min_factor: float = 0.0,
        threshold: float = 1e-4,
        higher_is_better: bool | None = None,
    ) -> None:
        if not 0.0 < factor < 1.0:
            raise ValueError(f"lr plateau: factor must be between 0 and 1 (exclusive), got {factor}")
        if patience < 0 or min_factor < 0.0 or threshold < 0.0:
            raise ValueError(
                "lr plateau: patience, min_factor and threshold must be >= 0, "
                f"got {patience}, {min_factor}, {threshold}"
            )
        self.metric = metric
        self.factor, self.patience, self.min_factor, self.threshold = factor, patience, min_factor, threshold
        self.higher_is_better = metric.higher_is_better if higher_is_better is None else higher_is_better
        self.best: float | None = None
        self.bad_passes = 0
        self.scale = 1.0
        self.last_step: int | None = None  # of the latest pass observed

    def observe(self, metrics: Metrics, step: int | None = None) -> float:
        """Take one evaluation pass's metrics (at `step`); returns the factor of the rates from now on.

        An undefined value (None) counts as a pass without a gain.
        """
        self.last_step = step
        value = self.metric.value(metrics)
        if value is not None and (self.best is None or self._better(value, self.best)):
            self.best, self.bad_passes = value, 0
        else:
            self.bad_passes += 1
        if self.bad_passes > self.patience:
            lowered = max(self.scale * self.factor, self.min_factor)
            if self.scale - lowered > _EPS:
                self.scale = lowered
            self.bad_passes = 0
        return self.scale

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint's manifest."""
        return {
            "metric": self.metric.name,
            "best": self.best,
            "bad_passes": self.bad_passes,
            "scale": self.scale,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> bool:
        """Go on from a saved state; False (and nothing taken) when it tracked another metric."""
        if state.get("metric") != self.metric.name:
            return False
        self.best, self.bad_passes, self.scale = state["best"], int(state["bad_passes"]), float(state["scale"])
        self.last_step = state.get("last_step")
        return True

    def missed(self, step: int, eval_every: int) -> bool:
        """Whether a checkpoint at `step` was saved before that step's evaluation pass: a run resumed
        from it must evaluate first (as EarlyStopping.missed)."""
        return missed_evaluation(self.last_step, step, eval_every)

    def _better(self, value: float, best: float) -> bool:
        # torch's threshold_mode "rel" (best is the metric's, which may be negative: compare by magnitude)
        if self.higher_is_better:
            return value > best + abs(best) * self.threshold
        return value < best - abs(best) * self.threshold


def plateau_from_spec(
    config: PlateauConfig | None, heads: Sequence[HeadConfig], eval_data: str | None
) -> LrPlateau | None:
    """The spec's `training.lr_plateau` for a run; UsageError when the run has no evaluation split."""
    if config is None:
        return None
    if eval_data is None:
        raise UsageError(
            f"training.lr_plateau ({config.where}) needs --eval-data (the split {config.metric} is measured on)"
        )
    return LrPlateau(
        resolve_best_metric(config.metric, heads),
        factor=config.factor,
        patience=config.patience,
        min_factor=config.min_factor,
        threshold=config.threshold,
        higher_is_better=None if config.mode is None else config.mode == "max",
    )
