"""Early stopping and the best checkpoint: `--best-metric NAME [--patience P]`.

The training worker hands `EarlyStopping.observe` every evaluation pass's
metrics (runtime.reporting.monitor calls it after each `--eval-every` pass
and the final one). A pass whose value of the chosen metric beats every
earlier one is a new best: the worker saves it to `DIR/best`
(runtime.train.checkpointing). After `patience` passes in a row without a
gain, `should_stop()` turns true and the loop ends after that step.

Direction follows the name: lower is better for the losses and errors in
LOWER_IS_BETTER (ne, log_loss, mse, rmse), higher for everything else (auc,
accuracy, recall@k, ndcg@k, mrr, hit_rate@k). A gain is strict: a pass
equal to the best (as rounded in the log) is no gain.

N ranks decide alike: evaluation metrics are all-reduced and gathered, and
every rank then takes rank 0's figures (runtime.reporting.metrics.agreed), so
every rank observes the same numbers, in the same order of passes, and stops
at the same step; none is left waiting for a rank that stopped.

    >>> from runtime.config.heads import HeadConfig
    >>> tracker = EarlyStopping(resolve_best_metric("auc", [HeadConfig("click", "bce", "click")]), patience=2)
    >>> [tracker.observe(step, {"click": {"auc": auc}}) for step, auc in ((10, 0.7), (20, 0.8), (30, 0.79), (40, 0.8))]
    [True, True, False, False]
    >>> tracker.stop_reason
    'click.auc did not improve for 2 evaluations (best 0.8 at step 20)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from runtime.config.heads import HeadConfig
from runtime.reporting.metrics import DEFAULT_METRICS
from runtime.train.options import UsageError

LOWER_IS_BETTER = frozenset({"ne", "log_loss", "mse", "rmse"})  # the lower-is-better names of the schema's metrics

Metrics = Mapping[str, Mapping[str, float | None]]


@dataclass(frozen=True, slots=True)
class BestMetric:
    """The evaluation metric that picks the best checkpoint: one head's one metric."""

    head: str
    metric: str

    @property
    def name(self) -> str:
        return f"{self.head}.{self.metric}"

    @property
    def higher_is_better(self) -> bool:
        return self.metric not in LOWER_IS_BETTER

    def value(self, metrics: Metrics) -> float | None:
        """Its value in one evaluation's metrics (None when undefined, e.g. AUC of one class)."""
        return metrics.get(self.head, {}).get(self.metric)


def head_metrics(head: HeadConfig) -> tuple[str, ...]:
    """The metrics reported for `head` (runtime.reporting.metrics's choice)."""
    return head.metrics or DEFAULT_METRICS[head.loss]


def resolve_best_metric(name: str, heads: Sequence[HeadConfig]) -> BestMetric:
    """`metric` or `head.metric` as one head's metric; UsageError naming what there is."""
    available = [(head.name, metric) for head in heads for metric in head_metrics(head)]
    listed = ", ".join(f"{h}.{m}" for h, m in available)
    head, dot, metric = name.partition(".")
    if dot:
        found = [(h, m) for h, m in available if (h, m) == (head, metric)]
    else:
        found = [(h, m) for h, m in available if m == name]
    if not found:
        raise UsageError(f"--best-metric {name!r}: no head reports it; the heads' metrics are {listed}")
    if len(found) > 1:
        heads_named = " and ".join(h for h, _ in found)
        raise UsageError(
            f"--best-metric {name!r}: heads {heads_named} both report it; name one, e.g. {found[0][0]}.{name}"
        )
    return BestMetric(*found[0])


def missed_evaluation(last_step: int | None, step: int, eval_every: int) -> bool:
    """Whether a tracker that last observed the pass of `last_step` was saved at `step` before that
    step's evaluation pass (see `EarlyStopping.missed`)."""
    return bool(eval_every) and step > 0 and step % eval_every == 0 and (last_step or 0) < step


class EarlyStopping:
    """The best value of `metric` so far and the passes since; stop after `patience` without a gain.

    `patience` None keeps the best checkpoint and never stops.
    """

    def __init__(self, metric: BestMetric, patience: int | None = None) -> None:
        self.metric = metric
        self.patience = patience
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.since_best = 0  # evaluation passes since the best one
        self.last_step: int | None = None  # of the latest pass observed

    def observe(self, step: int, metrics: Metrics) -> bool:
        """Take one evaluation pass at `step`; True when it is a new best."""
        value = self.metric.value(metrics)
        self.last_step = step
        if value is not None and (self.best_value is None or self._better(value, self.best_value)):
            self.best_value, self.best_step, self.since_best = value, step, 0
            return True
        self.since_best += 1
        return False

    def should_stop(self) -> bool:
        return self.patience is not None and self.since_best >= self.patience

    @property
    def stop_reason(self) -> str | None:
        """Why training stops, or None while it goes on."""
        if not self.should_stop():
            return None
        passes = f"{self.since_best} evaluation{'s' if self.since_best != 1 else ''}"
        if self.best_value is None:
            return f"{self.metric.name} was undefined for {passes}"
        return f"{self.metric.name} did not improve for {passes} (best {self.best_value:g} at step {self.best_step})"

    def best(self) -> dict[str, Any]:
        """The best pass as plain data: what the best checkpoint's manifest and the result line keep."""
        return {"metric": self.metric.name, "value": self.best_value, "step": self.best_step}

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint's manifest, so a resumed run counts on."""
        return {**self.best(), "since_best": self.since_best, "last_step": self.last_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> bool:
        """Go on from a saved state; False (and nothing taken) when it tracked another metric."""
        if state.get("metric") != self.metric.name:
            return False
        self.best_value, self.best_step = state["value"], state["step"]
        self.since_best, self.last_step = int(state["since_best"]), state["last_step"]
        return True

    def missed(self, step: int, eval_every: int) -> bool:
        """Whether a checkpoint at `step` was saved before that step's evaluation pass (a save
        on a log step, or after the last step): a run resumed from it must evaluate first."""
        return missed_evaluation(self.last_step, step, eval_every)

    def _better(self, value: float, best: float) -> bool:
        return value > best if self.metric.higher_is_better else value < best
