"""Applies a learning-rate schedule to a model's optimizers before each training step.

The training loop (runtime/train/loop.py) calls `LrScheduler.start_step(t)`
before the step that follows t completed steps, plainly or pipelined: the
pipeline's stage 1 (backward, where the tables update, and the dense
optimizer's step) runs inside that step, and its stage 0 reads no learning
rate. The factor `schedule.factor(t)` (runtime.config.lr_schedule) multiplies

- each parameter group of the dense optimizer: lr = initial lr x factor, the
  initial lr kept in the group as `initial_lr` (torch's own schedulers' key);
- every embedding table's optimizer, fused into backward: fbgemm TBE's
  learning rate, or the dense kernel's optimizer hook (`set_lr_scale` of
  SparseArch and of the embedding collections), each table at its own
  optimizer's lr x factor, per-table optimizers included.

With a reduce-on-plateau (runtime.train.lr_plateau), its factor multiplies
the step's: `observe(metrics)` after each evaluation pass sets the new rates
at once, so the next update trains at them.

The step's factor depends on the step alone and the plateau's state is
saved with it, so a resumed run sets exactly the rates the uninterrupted run
had. `state_dict()` goes into the checkpoint's
manifest; `load_state_dict` reads it back on resume and says whether the
checkpoint was trained with another schedule (possible with
--allow-spec-change only): the run then goes on with its own schedule, at
its step.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from runtime.config.lr_schedule import LrSchedule, spell
from runtime.train.callbacks import Callback
from runtime.train.early_stopping import Metrics
from runtime.train.lr_plateau import LrPlateau

__all__ = ["LrScheduler", "ReduceOnPlateau", "ScheduleState"]


class LrScheduler:
    """Sets the learning rates of `optimizer` and of `model`'s embedding tables per step.

    Build it before loading a checkpoint into `optimizer`: the initial rates
    are read from its groups here (or from their `initial_lr`, when set).
    """

    def __init__(
        self,
        schedule: LrSchedule,
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module,
        plateau: LrPlateau | None = None,
    ) -> None:
        self.schedule = schedule
        self.plateau = plateau
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        # SparseArch, or embedding collections held in the module tree.
        self._tables = [m for m in model.modules() if callable(getattr(m, "set_lr_scale", None))]
        self.completed = 0
        self.scale = schedule.factor(0)
        self.resumed_plateau = False  # the plateau goes on from a checkpoint's state

    def start_step(self, completed: int) -> float:
        """Set every rate for the update after `completed` steps; returns the factor."""
        self.completed = completed
        self.scale = self.schedule.factor(completed) * (1.0 if self.plateau is None else self.plateau.scale)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * self.scale
        for module in self._tables:
            module.set_lr_scale(self.scale)
        return self.scale

    def observe(self, metrics: Metrics, step: int | None = None) -> float:
        """Take an evaluation pass's metrics (at `step`, when reducing on plateau) and set the rates
        the next update trains at; returns the factor."""
        if self.plateau is not None:
            self.plateau.observe(metrics, step)
        return self.start_step(self.completed)

    @property
    def lr(self) -> float:
        """The dense optimizer's learning rate (of its first group) in the current step."""
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self, completed: int) -> dict[str, Any]:
        """Plain data for the manifest of a checkpoint after `completed` steps: the schedule, the
        steps, and the factor the next step trains at."""
        plateau = {} if self.plateau is None else {"plateau": self.plateau.state_dict()}
        return {
            "schedule": self.schedule.describe(),
            "completed": completed,
            "next_scale": self.schedule.factor(completed) * (1.0 if self.plateau is None else self.plateau.scale),
            **plateau,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> bool:
        """Go on from a checkpoint's `state_dict()`; False if it was saved under another schedule.
        A plateau goes on from its saved state (`resumed_plateau`) unless it tracked another metric."""
        same = dict(state["schedule"]) == self.schedule.describe()
        if self.plateau is not None:
            saved = state.get("plateau")
            self.resumed_plateau = saved is not None and self.plateau.load_state_dict(saved)
        self.start_step(int(state["completed"]))
        return same


class ScheduleState:
    """The scheduler as a checkpoint's state (the manifest's "lr_schedule": runtime.checkpoint.states).

    Taken as of `step()`, the step being saved: the scheduler itself counts the step
    under way. After a load, `load_notes` says, after the checkpoint's path, that it was
    trained with another schedule (the run goes on with its own, at its step).
    """

    def __init__(self, scheduler: LrScheduler, step: Callable[[], int]) -> None:
        self.scheduler = scheduler
        self.step = step
        self.load_notes: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict(self.step())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        same = self.scheduler.load_state_dict(state_dict)
        self.load_notes = (
            []
            if same
            else [
                f" was trained with lr_schedule {spell(state_dict['schedule'])}; this run goes on from step "
                f"{int(state_dict['completed'])} with {spell(self.scheduler.schedule.describe())}"
            ]
        )


class ReduceOnPlateau(Callback):
    """`training.lr_plateau`: every evaluation pass's metrics go to the plateau, which sets the rates
    the next update trains at; a run resumed from a state saved before its step's pass evaluates first."""

    def __init__(self, scheduler: LrScheduler, eval_every: int) -> None:
        assert scheduler.plateau is not None
        self.scheduler, self.plateau, self.eval_every = scheduler, scheduler.plateau, eval_every

    def on_eval(self, step: int, metrics: Metrics) -> None:
        self.scheduler.observe(metrics, step)

    def evaluate_on_resume(self, start_step: int) -> bool:
        return self.scheduler.resumed_plateau and self.plateau.missed(start_step, self.eval_every)
