"""The served models by name, each with its batcher; a reload swaps a new export in atomically.

    slot = Slot(lambda: load_model(out), options, metrics)   # loads now; its batcher runs on the event loop
    model = slot.model            # what a request is checked against and runs on, start to finish
    slot.reload()                 # loads again from the same place, then swaps (one assignment)

A request takes `slot.model` once, when it arrives, and carries it into its
batch: the batcher runs each request on the model it was checked against, so
requests in flight during a reload finish on the old model and the next ones
run on the new; the old model is freed when the last of them is answered.
A reload that fails (a half-written or bad export) raises and leaves the
old model serving. Reloading never takes a path from a request: it reads the
directories given on the command line again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.serving.online.batcher import Batcher
from runtime.serving.online.metrics import Metrics
from runtime.serving.online.models import ServedModel

__all__ = ["BatchOptions", "ReloadError", "Slot"]


class ReloadError(Exception):
    """The reloaded export cannot replace the served one."""


@dataclass(frozen=True)
class BatchOptions:
    max_batch: int
    max_wait: float  # seconds
    max_queue: int  # rows


class Slot:
    def __init__(self, load: Callable[[], ServedModel], options: BatchOptions, metrics: Metrics) -> None:
        self.load = load
        self.model = load()
        self.metrics = metrics
        self._reloading = threading.Lock()
        self.batcher = Batcher(self._run, max_batch=options.max_batch, max_wait=options.max_wait,
                               max_queue=options.max_queue, metrics=metrics, model=self.model.name)  # fmt: skip

    def reload(self) -> ServedModel:
        """Load the export again and swap it in; ReloadError (the old model still serving) if its name changed."""
        with self._reloading:
            new = self.load()
            if new.name != self.model.name:
                raise ReloadError(
                    f"{new.source} now holds model {new.name!r}, not {self.model.name!r}: "
                    "restart the server to serve it"
                )
            self.model = new
            self.metrics.reloaded(new.name)
            return new

    @staticmethod
    def _run(works: Sequence[tuple[ServedModel, Any]]) -> list[Any]:
        """Each (model, request) on its own model: one batch per model in the queue (two during a reload)."""
        answers: list[Any] = [None] * len(works)
        groups: dict[int, list[int]] = {}
        for index, (model, _) in enumerate(works):
            groups.setdefault(id(model), []).append(index)
        for indices in groups.values():
            model = works[indices[0]][0]
            for index, answer in zip(indices, model.predict([works[i][1] for i in indices]), strict=True):
                answers[index] = answer
        return answers
