"""Checks of the blocks' constructor arguments, shared by every module of runtime/modules.

Each check raises ValueError naming the block (its type, and the spec
location it was compiled from when known), the argument and the bad value,
e.g. `MLP (specs/a.yaml:4:5): layers[1] must be an integer >= 1 (got -4)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["check_layers", "check_probability", "check_size", "owner"]


def owner(kind: str, where: str) -> str:
    """How errors name a block: its type, and the spec location it was compiled from when known."""
    return f"{kind} ({where})" if where else kind


def check_size(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    """`value` if it is an int (not a bool) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum} (got {value!r})")
    return value


def check_layers(owner: str, name: str, layers: Any) -> list[int]:
    """`layers` as a list if it is a non-empty sequence of sizes >= 1."""
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
        raise ValueError(f"{owner}: {name} must be a non-empty list of sizes (got {layers!r})")
    return [check_size(owner, f"{name}[{i}]", size) for i, size in enumerate(layers)]


def check_probability(owner: str, name: str, value: Any) -> float:
    """`value` as a float if it is a number in [0, 1) (a dropout probability)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{owner}: {name} must be a number in [0, 1) (got {value!r})")
    return float(value)
