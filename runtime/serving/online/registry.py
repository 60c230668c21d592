"""The served models by name, each with its batcher; a reload swaps a new export in atomically.

    slot = Slot(lambda: load_model(out), options, metrics, (out,))   # loads now; its batcher runs on the event loop
    model = slot.model            # what a request is checked against and runs on, start to finish
    slot.reload()                 # loads again from the same place, then swaps (one assignment)

A request takes `slot.model` once, when it arrives, and carries it into its
batch: the batcher runs each request on the model it was checked against, so
requests in flight during a reload finish on the old model and the next ones
run on the new; the old model is freed when the last of them is answered.
A reload that fails (a half-written or bad export) raises, counts in
`reccompile_reload_failures_total` and leaves the old model serving.
Reloading never takes a path from a request: it reads the directories
given on the command line again.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.serving.export_dir import MANIFEST
from runtime.serving.online.batcher import INLINE_ROWS, Batcher
from runtime.serving.online.metrics import Metrics
from runtime.serving.online.models import ServedModel

__all__ = ["BatchOptions", "ReloadError", "Slot", "manifest_digests"]


class ReloadError(Exception):
    """The reloaded export cannot replace the served one."""


@dataclass(frozen=True)
class BatchOptions:
    max_batch: int
    max_wait: float  # seconds
    max_queue: int  # rows
    inline_rows: int = INLINE_ROWS  # batches of at most this many rows run on the event loop


class Slot:
    def __init__(
        self,
        load: Callable[[], ServedModel],
        options: BatchOptions,
        metrics: Metrics,
        directories: tuple[Path, ...] = (),
    ) -> None:
        self.load, self.directories = load, directories  # directories: what `load` reads (watched by --watch)
        self.digests = manifest_digests(directories)  # taken before the load: a change during it is seen later
        self.model = load()
        self.metrics = metrics
        self._reloading = threading.Lock()
        self.batcher = Batcher(
            self._run,
            max_batch=options.max_batch,
            max_wait=options.max_wait,
            max_queue=options.max_queue,
            metrics=metrics,
            model=self.model.name,
            inline_rows=options.inline_rows,
        )

    def reload(self) -> ServedModel:
        """Load the export again and swap it in; ReloadError (the old model still serving) if its name changed."""
        with self._reloading:
            digests = manifest_digests(self.directories)
            try:
                new = self.load()
            except Exception:
                self.metrics.reload_failed(self.model.name)
                raise
            if new.name != self.model.name:
                self.metrics.reload_failed(self.model.name)
                raise ReloadError(
                    f"{new.source} now holds model {new.name!r}, not {self.model.name!r}: "
                    "restart the server to serve it"
                )
            self.model, self.digests = new, digests
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


def manifest_digests(directories: tuple[Path, ...]) -> tuple[str | None, ...]:
    """The sha256 of each directory's manifest.json bytes (None where it cannot be read)."""
    digests: list[str | None] = []
    for directory in directories:
        try:
            digests.append(hashlib.sha256((directory / MANIFEST).read_bytes()).hexdigest())
        except OSError:
            digests.append(None)
    return tuple(digests)
