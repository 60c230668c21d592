"""The spec's `training.lr_plateau`: its metric checked against the heads, as the IR's `LrPlateau`.

Called by `compiler.spec.build` once the heads are resolved (the schema pass
has checked types and ranges, and filled nothing: the defaults are here). The
metric is found as early stopping's is (compiler.spec.early_stopping).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compiler.ir import Head, LrPlateau
from compiler.spec.checker import INVALID, Checker, known
from compiler.spec.early_stopping import find_head_metric
from compiler.spec.load import Node

__all__ = ["resolve_lr_plateau"]

DEFAULTS = {"factor": 0.1, "patience": 1, "min_factor": 0.0, "threshold": 1e-4}


def resolve_lr_plateau(checker: Checker, training: Node | None, heads: Sequence[Head | None]) -> Any:
    """None when absent, INVALID when its metric names none of the heads' (reported), else LrPlateau."""
    node = checker.child(training, "lr_plateau")
    if node is None:
        return None
    metric, mode = checker.value(node, "metric"), checker.value(node, "mode")
    values = {key: checker.value(node, key) for key in DEFAULTS}
    if not known(metric, mode, *values.values()) or not isinstance(metric, str) or None in heads:
        return INVALID
    if not find_head_metric(checker, checker.child(node, "metric") or node, metric, heads):
        return INVALID
    given = {key: default if values[key] is None else values[key] for key, default in DEFAULTS.items()}
    return LrPlateau(
        metric,
        mode,
        float(given["factor"]),
        int(given["patience"]),
        float(given["min_factor"]),
        float(given["threshold"]),
        node.key_loc or node.loc,
    )
