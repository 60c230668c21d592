"""Learning-rate schedules: the factor every optimizer's learning rate is multiplied by, per step.

A generated module describes its schedule as an `LrSchedule` (its LR_SCHEDULE
constant, from the spec's `training.lr_schedule`); runtime.train.lr_scheduler
applies it to the dense optimizer and to every embedding table's fused
optimizer alike, each keeping its own base learning rate. This module is
plain Python (no torch), so the compiler checks a spec's schedule with the
same rules (`problems`).

`factor(t)` is the factor of the update made after t completed steps (0 for
the first update), as torch's schedulers count. With W = warmup_steps,
s0 = start_factor, d = t - W (the steps since the warmup ended):

    t < W          s0 + (1 - s0) * t / W              (every type)
    constant       1
    step           gamma ** floor(d / step_size)
    exponential    gamma ** d
    linear         f + (1 - f) * (1 - p)               p = min(d, T - W) / (T - W),
    cosine         f + (1 - f) * (1 + cos(pi * p)) / 2 T = total_steps, f = final_factor

so linear and cosine reach `final_factor` at t = T and keep it after.

    >>> LrSchedule("cosine", warmup_steps=2, total_steps=6, final_factor=0.1).factors(7)
    (0.0, 0.5, 1.0, 0.8681980515339464, 0.55, 0.23180194846605365, 0.1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

LR_SCHEDULE_TYPES = ("constant", "step", "exponential", "linear", "cosine")

PARAMETERS = ("type", "warmup_steps", "start_factor", "step_size", "gamma", "total_steps", "final_factor")
# The parameters each type reads besides warmup_steps and start_factor, and which it needs.
READS: dict[str, tuple[str, ...]] = {
    "constant": (),
    "step": ("step_size", "gamma"),
    "exponential": ("gamma",),
    "linear": ("total_steps", "final_factor"),
    "cosine": ("total_steps", "final_factor"),
}
_NEEDS: dict[str, tuple[str, ...]] = {
    "constant": (),
    "step": ("step_size", "gamma"),
    "exponential": ("gamma",),
    "linear": ("total_steps",),
    "cosine": ("total_steps",),
}


@dataclass(frozen=True, slots=True)
class LrSchedule:
    """A schedule of the learning-rate factor (see the module docstring for the formulas).

    Parameters a type does not read are None; `final_factor` None means 0.
    `where` is the spec location it was compiled from, named in errors.
    """

    type: str = "constant"
    warmup_steps: int = 0
    start_factor: float = 0.0
    step_size: int | None = None
    gamma: float | None = None
    total_steps: int | None = None
    final_factor: float | None = None
    where: str = ""

    def __post_init__(self) -> None:
        found = problems(**self.describe())
        if found:
            at = f" ({self.where})" if self.where else ""
            raise ValueError(f"lr_schedule{at}: " + "; ".join(message for _, message in found))

    def factor(self, completed: int) -> float:
        """The learning-rate factor of the update after `completed` steps (0: the first update)."""
        if completed < 0:
            raise ValueError(f"lr_schedule: completed steps must be >= 0, got {completed}")
        warmup = self.warmup_steps
        if completed < warmup:
            return self.start_factor + (1.0 - self.start_factor) * completed / warmup
        since = completed - warmup
        if self.type == "step":
            assert self.gamma is not None and self.step_size is not None
            return self.gamma ** (since // self.step_size)
        if self.type == "exponential":
            assert self.gamma is not None
            return self.gamma**since
        if self.type in ("linear", "cosine"):
            assert self.total_steps is not None
            final = 0.0 if self.final_factor is None else self.final_factor
            progress = min(since, self.total_steps - warmup) / (self.total_steps - warmup)
            if self.type == "linear":
                return final + (1.0 - final) * (1.0 - progress)
            return final + (1.0 - final) * (1.0 + math.cos(math.pi * progress)) / 2.0
        return 1.0

    def factors(self, steps: int) -> tuple[float, ...]:
        """The factors of the first `steps` updates."""
        return tuple(self.factor(t) for t in range(steps))

    def describe(self) -> dict[str, Any]:
        """The schedule's parameters that are set, as plain data (checkpoint manifests keep it)."""
        return {key: getattr(self, key) for key in PARAMETERS if getattr(self, key) is not None}


def spell(described: Mapping[str, Any]) -> str:
    """`cosine(warmup_steps=2, total_steps=9)`: a `describe()` (or a manifest's copy) as one line."""
    params = ", ".join(f"{key}={described[key]}" for key in PARAMETERS[1:] if key in described)
    return f"{described['type']}({params})"


def problems(
    type: str,
    warmup_steps: int = 0,
    start_factor: float = 0.0,
    step_size: int | None = None,
    gamma: float | None = None,
    total_steps: int | None = None,
    final_factor: float | None = None,
) -> list[tuple[str, str]]:
    """What is wrong with a schedule of these parameters, as (parameter, message); empty if nothing.

    The compiler reports each message at its parameter's line in the spec.
    """
    if type not in LR_SCHEDULE_TYPES:
        return [("type", f"unknown schedule {type!r}; expected one of {', '.join(LR_SCHEDULE_TYPES)}")]
    given = {"step_size": step_size, "gamma": gamma, "total_steps": total_steps, "final_factor": final_factor}
    found: list[tuple[str, str]] = []
    for key, value in given.items():
        if value is not None and key not in READS[type]:
            users = [kind for kind, reads in READS.items() if key in reads]
            found.append((key, f"{key} does not apply to {type} (it is used by {', '.join(users)})"))
    found += [("type", f"{type} needs {key}") for key in _NEEDS[type] if given[key] is None]
    found += _range_problems(warmup_steps, start_factor, given)
    if start_factor != 0.0 and warmup_steps == 0:
        found.append(("start_factor", "start_factor is the warmup's first factor, but warmup_steps is 0"))
    if total_steps is not None and warmup_steps >= total_steps >= 1:
        found.append(("total_steps", f"total_steps {total_steps} must be greater than warmup_steps {warmup_steps}"))
    return found


def _range_problems(warmup_steps: int, start_factor: float, given: dict[str, Any]) -> list[tuple[str, str]]:
    """The schema's bounds, for schedules built without the compiler."""
    checks = [
        ("warmup_steps", warmup_steps, warmup_steps >= 0, ">= 0"),
        ("start_factor", start_factor, 0.0 <= start_factor <= 1.0, "between 0 and 1"),
        ("step_size", given["step_size"], given["step_size"] is None or given["step_size"] >= 1, ">= 1"),
        ("gamma", given["gamma"], given["gamma"] is None or given["gamma"] > 0.0, "> 0"),
        ("total_steps", given["total_steps"], given["total_steps"] is None or given["total_steps"] >= 1, ">= 1"),
        (
            "final_factor",
            given["final_factor"],
            given["final_factor"] is None or 0.0 <= given["final_factor"] <= 1.0,
            "between 0 and 1",
        ),
    ]
    return [(key, f"{key} must be {bound} (got {value})") for key, value, ok, bound in checks if not ok]
