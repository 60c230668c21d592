"""Kernel choices kept by the serving modules that make them on every call.

runtime/cpu/choice.py reads a recorded choice through its on-disk key (cache
directory, CPU identity, file name) at each call: 10-40 us here, paid per
layer and lookup, 0.1-0.5 ms of a 5 ms dlrm-bench forward at batch 512. A
`ChoiceMemo` keeps each decision by the caller's key and by what can change
the answer within a process (`RECCOMPILE_KERNELS`, `RECCOMPILE_CACHE_DIR`);
choices on disk are written once and never change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import TypeVar

from runtime.cpu import choice

__all__ = ["ChoiceMemo"]

T = TypeVar("T")
_SETTINGS = (choice.ENV, "RECCOMPILE_CACHE_DIR")


class ChoiceMemo:
    """decide(key) once per key and setting of the environment variables that steer choices."""

    def __init__(self) -> None:
        self._known: dict[tuple[Hashable, ...], object] = {}

    def get(self, key: Hashable, decide: Callable[[], T]) -> T:
        full = (key, *(os.environ.get(name) for name in _SETTINGS))
        if full not in self._known:
            self._known[full] = decide()
        return self._known[full]  # type: ignore[return-value]
