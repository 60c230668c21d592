"""Where the data loaders' worker processes start from: a fork server, never a fork of the rank.

By the time a rank reads data it has threads of its own: gloo's, torch's,
Arrow's jemalloc background thread, the feeder threads of the loaders
already running. fork() copies only the calling thread, and with it every
lock one of the others held at that instant, held for good in the child. A
child that then takes such a lock never starts. Seen: an evaluation's worker,
forked at step 75 of a two-rank run, never reached its first line, and both
ranks waited on it until CI's timeout (once in CI, once in 54 runs of
tests/compiler/commands/test_train_lr_plateau_ranks.py on a loaded machine
here; tests/runtime/data/test_loader_workers.py makes it certain).

The fork server is started once per process, by exec, before any of that; it
imports torch and the loader once, then forks each worker from its own clean
state. The first worker waits for those imports (about 1.5 s of CPU, once
per process); every later one starts as fast as a fork did. Arrow is not
preloaded: its jemalloc thread would be in the server too.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext

__all__ = ["worker_context"]

_PRELOAD = ["torch", "runtime.data.loader"]  # what every worker unpickles its dataset with


def worker_context(workers: int) -> BaseContext | None:
    """The multiprocessing context of a DataLoader with `workers` workers (None without workers,
    which is what DataLoader expects then)."""
    if workers == 0:
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context
