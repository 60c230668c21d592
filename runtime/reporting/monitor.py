"""What a training run reports besides its loss: metrics, evaluation, progress, the log directory.

The worker hands `TrainingMonitor.on_step` and `on_log` to `runtime.train.loop.train`.
Every step adds the heads' outputs to the metrics window; every log step
(`--log-every`) computes the window's metrics over all ranks, which rank 0
shows (runtime.reporting.console) and writes to `--log-dir`; every `--eval-every` steps and at the end
the evaluation split is scored (with MovieLens data, each pass also counts
the ids outside the training vocabulary: runtime.data.checks.unseen_ids), and each
pass goes to `on_evaluation` (early stopping: runtime.train.early_stopping), with
rank 0's figures on every rank (`metrics.agreed`). Metric computation and
evaluation are collectives, so every rank calls these hooks; only rank 0
prints or writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from runtime.config.heads import HeadConfig
from runtime.data.batch import Batch
from runtime.data.checks.unseen_ids import UnseenIds
from runtime.reporting.console import Console, format_metrics
from runtime.reporting.metrics import MetricSet, MetricValues, agreed
from runtime.reporting.run_log import RunLog
from runtime.retrieval.catalogue import Catalogue, StepCandidates

Metrics = dict[str, MetricValues]
_DIGITS = 6


@dataclass(frozen=True)
class StepLog:
    """What the training loop hands `on_log` every --log-every steps."""

    step: int  # 1-based
    loss: float  # the global mean loss of this step
    samples_per_s: float | None  # None while no step past the first was timed
    lr: float | None = None  # the dense optimizer's learning rate in this step, when scheduled
    lr_scale: float | None = None  # the schedule's factor of every optimizer's rate


@dataclass(frozen=True)
class Evaluation:
    """One pass over the evaluation split: the heads' metrics, and the unseen ids when data has a vocabulary."""

    metrics: Metrics
    unseen_ids: UnseenIds | None = None


class TrainingMonitor:
    """Metrics, evaluation and reporting of one run; `console` and `run_log` on rank 0 only.

    `catalogue`: the candidates of a retrieval head's metrics at log steps (see MetricSet; the
    worker passes runtime.retrieval.catalogue.StepCandidates: each step's candidates as its forward saw them).
    """

    def __init__(
        self,
        heads: Sequence[HeadConfig],
        *,
        steps: int,
        log_every: int,
        global_batch_size: int,
        process_group: dist.ProcessGroup | None = None,
        console: Console | None = None,
        run_log: RunLog | None = None,
        evaluation: Callable[[], Evaluation] | None = None,
        eval_every: int = 0,
        on_evaluation: Callable[[int, Metrics], None] | None = None,
        catalogue: Catalogue | StepCandidates | None = None,
    ) -> None:
        self.metrics = MetricSet(heads, catalogue)
        self.steps = steps
        self.log_every = log_every
        self.global_batch_size = global_batch_size
        self.process_group = process_group
        self.console = console
        self.run_log = run_log
        self.evaluation = evaluation
        self.eval_every = eval_every
        self.on_evaluation = on_evaluation
        self.stopped: dict[str, Any] | None = None  # {"step", "reason"} of a run stopped early
        self.last_metrics: Metrics = {}
        self.last_eval: Metrics | None = None
        self.last_eval_unseen: dict[str, int] | None = None  # of the last evaluation pass
        self._last_eval_step = 0
        self._eval_after_log = False
        self._log_begun = False
        self._first_step: tuple[int, float] | None = None  # (step, when it finished); runs may resume
        self._window_first: int | None = None  # the first step in the metrics window

    def on_step(self, step: int, batch: Batch, outputs: Mapping[str, torch.Tensor], loss: torch.Tensor) -> None:
        """After each step: add to the metrics window, move the bar, evaluate when due."""
        self.metrics.update(outputs, batch.labels)
        if self._window_first is None:
            self._window_first = step
        now = time.perf_counter()
        if self._first_step is None:
            self._first_step = (step, now)
            self._begin_log(step - 1)
        if self.console is not None:
            first, since = self._first_step
            elapsed = now - since
            rate = self.global_batch_size * (step - first) / elapsed if step > first and elapsed > 0 else None
            self.console.advance(step, rate)
        if self.evaluation is not None and self.eval_every and step % self.eval_every == 0 and step < self.steps:
            if step % self.log_every == 0:
                self._eval_after_log = True  # so its line follows the step's line
            else:
                self._evaluate(step)

    def on_log(self, entry: StepLog) -> None:
        """Every log step: the window's metrics over all ranks, printed and logged on rank 0.

        A window that began later than the previous log step of an uninterrupted run (the first
        after a resume: the steps before it were not saved) is named with its steps."""
        self.last_metrics = _rounded(self.metrics.compute(self.process_group))
        first, self._window_first = self._window_first, None
        full = (entry.step - 1) // self.log_every * self.log_every + 1
        window = (first, entry.step) if first is not None and first > full else None
        if self.console is not None:
            self.console.log(entry.step, entry.loss, entry.samples_per_s, self.last_metrics, entry.lr, window)
        if self.run_log is not None:
            self.run_log.train(
                entry.step, entry.loss, entry.samples_per_s, self.last_metrics, entry.lr, entry.lr_scale, window
            )
        if self._eval_after_log:
            self._eval_after_log = False
            self._evaluate(entry.step)

    def evaluate(self, step: int) -> None:
        """Score the evaluation split now, as after `step` (a resumed run's missed pass)."""
        self._begin_log(step)
        self._evaluate(step)

    def begin(self, start_step: int) -> None:
        """Open the run's log as going on from `start_step`, before any step: a resumed run with no
        step left (finished, or stopped early) still appends its final evaluation and record to the
        log of the run it resumes, instead of finding it closed or starting it afresh."""
        self._begin_log(start_step)

    def _begin_log(self, start_step: int) -> None:
        if self.run_log is not None and not self._log_begun:
            self.run_log.begin(start_step)  # a resumed run appends to the log
            self._log_begun = True

    def stop(self, step: int, reason: str) -> None:
        """Training stopped early after `step`: said on the console and in the log, kept for the result."""
        self.stopped = {"step": step, "reason": reason}
        if self.console is not None:
            self.console.message(f"stopped early at step {step}/{self.steps}: {reason}")
        if self.run_log is not None:
            self.run_log.stop(step, reason)

    def final_evaluation(self) -> None:
        """Score the evaluation split after the last step (unless that was just done)."""
        last = self.steps if self.stopped is None else self.stopped["step"]
        if self.evaluation is not None and self._last_eval_step != last:
            self._evaluate(last)

    def finish(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """`summary` plus the final metrics: the run's last JSON line (also logged)."""
        final = {**summary, "metrics": self.last_metrics}
        if self.last_eval is not None:
            final["eval_metrics"] = self.last_eval
        if self.last_eval_unseen is not None:
            final["eval_unseen_ids"] = self.last_eval_unseen
        if self.stopped is not None:
            final["stopped_early"] = self.stopped
        if self.console is not None:
            self.console.close()
        if self.run_log is not None:
            self.run_log.close(final)
        return final

    def _evaluate(self, step: int) -> None:
        assert self.evaluation is not None
        result = self.evaluation()
        # Rank 0's figures on every rank, so the callbacks deciding from them decide alike.
        self.last_eval = agreed(_rounded(result.metrics), self.process_group)
        unseen = result.unseen_ids
        self.last_eval_unseen = None if unseen is None else dict(unseen.counts)
        self._last_eval_step = step
        if self.console is not None:
            seen = "" if unseen is None else f"  {unseen.describe()}"
            self.console.message(f"eval {step:>5}/{self.steps}{format_metrics(self.last_eval)}{seen}")
        if self.run_log is not None:
            self.run_log.eval(step, self.last_eval, self.last_eval_unseen)
        if self.on_evaluation is not None:
            self.on_evaluation(step, self.last_eval)


def _rounded(metrics: Metrics) -> Metrics:
    return {
        head: {name: None if v is None else round(v, _DIGITS) for name, v in values.items()}
        for head, values in metrics.items()
    }
