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

A worker's parent is then the server, not the rank, and the server lives as
long as any of its workers does (each holds the pipe it watches), so a
worker cannot die with its parent as a forked one did: it dies with the rank
that asked for it (runtime.process.lifetime.die_with), and the server, its
last client gone, follows.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from typing import Any

from runtime.process.lifetime import die_with, die_with_parent

__all__ = ["loader_workers"]

_PRELOAD = ["torch", "runtime.data.loader"]  # what every worker unpickles its dataset with


def loader_workers(workers: int) -> dict[str, Any]:
    """A DataLoader's keyword arguments for `workers` worker processes: started by the fork server,
    each ending with this process (see the module docstring)."""
    if workers == 0:
        return {"num_workers": 0}
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return {
        "num_workers": workers,
        "multiprocessing_context": context,
        "worker_init_fn": functools.partial(_die_with, os.getpid()),
    }


def _die_with(rank: int, worker: int) -> None:
    die_with_parent()  # the server
    die_with(rank)
