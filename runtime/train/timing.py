"""Time spent outside training steps (evaluation passes, checkpoint saves), kept apart.

samples/s counts training only: the loop subtracts what `OtherWork` measured
in its hooks, and the run's JSON result reports each kind on its own.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

KINDS = ("eval", "checkpoint")


class OtherWork:
    """Seconds spent per kind of work that is not a training step."""

    def __init__(self) -> None:
        self.seconds = {kind: 0.0 for kind in KINDS}

    @contextmanager
    def measure(self, kind: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] += time.perf_counter() - started

    def total(self) -> float:
        return sum(self.seconds.values())

    def as_json(self) -> dict[str, float]:
        return {f"{kind}_seconds": round(seconds, 3) for kind, seconds in self.seconds.items()}
