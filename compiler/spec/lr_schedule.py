"""The spec's `training.lr_schedule`: checked, with its defaults filled, as the IR's `LrSchedule`.

Called by `compiler.spec.build` after `resolve_training` (the schema pass has
checked types and ranges). The rules that involve several parameters (what
each type reads and needs, warmup before the end of the decay) are the
runtime's own (`runtime.config.lr_schedule.problems`), reported here at the
line of the parameter they are about.
"""

from __future__ import annotations

from typing import Any

from compiler.ir import LrSchedule
from compiler.spec.checker import INVALID, Checker, known
from compiler.spec.load import Node
from runtime.config.lr_schedule import PARAMETERS, READS, problems

__all__ = ["resolve_lr_schedule"]


def resolve_lr_schedule(checker: Checker, training: Node | None) -> Any:
    """The schedule under the training section `training`: the constant default if absent,
    INVALID if broken (every problem reported)."""
    node = checker.child(training, "lr_schedule")
    if node is None:
        return LrSchedule()
    values = {key: checker.value(node, key) for key in PARAMETERS}
    if not known(*values.values()) or not isinstance(values["type"], str):
        return INVALID
    given = {key: value for key, value in values.items() if value is not None}
    found = problems(**given)
    for key, message in found:
        param = checker.child(node, key)
        if key == "type" or param is None:
            checker.error(checker.child(node, "type") or node, message)
        else:
            # A parameter the type does not read is wrong where its key is written.
            checker.error(param, message, at_key=key not in READS[values["type"]])
    if found:
        return INVALID
    floats = ("start_factor", "gamma", "final_factor")
    return LrSchedule(**{k: float(v) if k in floats else v for k, v in given.items()}, loc=node.key_loc or node.loc)
