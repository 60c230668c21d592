"""The spec's `training.early_stopping`: its metric checked against the heads, as the IR's `EarlyStopping`.

Called by `compiler.spec.build` once the heads are resolved (the schema pass
has checked types and ranges). The metric is found as the runtime finds
`--best-metric` (runtime/train/early_stopping.py): `metric` of the one head
that reports it, or `head.metric`; any other name is a diagnostic at its line.
"""

from __future__ import annotations

from typing import Any, Sequence

from compiler.ir import EarlyStopping, Head
from compiler.spec.checker import INVALID, Checker, known
from compiler.spec.load import Node

__all__ = ["find_head_metric", "resolve_early_stopping"]


def resolve_early_stopping(checker: Checker, training: Node | None, heads: Sequence[Head | None]) -> Any:
    """None when absent, INVALID when its metric names none of the heads' (reported), else EarlyStopping."""
    node = checker.child(training, "early_stopping")
    if node is None:
        return None
    metric, patience = checker.value(node, "metric"), checker.value(node, "patience")
    if not known(metric, patience) or not isinstance(metric, str) or None in heads:
        return INVALID
    if not find_head_metric(checker, checker.child(node, "metric") or node, metric, heads):
        return INVALID
    return EarlyStopping(metric, patience, node.key_loc or node.loc)


def find_head_metric(checker: Checker, where: Node, metric: str, heads: Sequence[Head | None]) -> bool:
    """Whether exactly one head reports `metric` (or `head.metric`); else reported at `where`."""
    available = [(head.name, name) for head in heads if head is not None for name in head.metrics]
    head, dot, name = metric.partition(".")
    found = [pair for pair in available if (pair == (head, name) if dot else pair[1] == metric)]
    if not found:
        listed = ", ".join(f"{h}.{m}" for h, m in available)
        checker.error(where, f"no head reports '{metric}'; the heads' metrics are {listed}")
    elif len(found) > 1:
        both = " and ".join(h for h, _ in found)
        checker.error(where, f"heads {both} both report '{metric}'; name one, e.g. '{found[0][0]}.{metric}'")
    return len(found) == 1
