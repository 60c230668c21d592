"""The default process group's start and end, so that it ends before the rank's interpreter does.

`dist.destroy_process_group()` only unregisters the group; gloo's C++
backend, and its worker threads, live until the last Python reference to the
group goes. A worker thread lets go of each collective's tensors after the
caller's `wait()` has returned, and a tensor that has a Python object takes
the GIL to release it. If that happens while the interpreter finalizes,
Python ends the thread (pthread_exit) inside a C++ destructor, which is
noexcept: `terminate called without an active exception`, SIGABRT, and the
rank is lost at the very end of a run (issue 15: a rare abort of dlrm_bench's
two ranks, more frequent on a busy machine, where that thread runs late).

`close_process_group()` destroys the group and frees it while the
interpreter is whole: freeing it joins the worker threads with the GIL
released, so a late one finishes its release first. Two things would keep
the group alive past that point:

- torch.distributed.nn.functional's functions take `group=group.WORLD` as a
  default argument, evaluated at import. DDP imports that module on first
  use; imported after `init_process_group`, ten defaults hold the group
  until the interpreter ends. `init_process_group()` imports it first.
- the caller's own objects (a model, DDP, an autograd graph): close the
  group where they are gone. Reference cycles among them are collected.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
from typing import Any

import torch.distributed as dist

from runtime.process import shm_exchange

__all__ = ["close_process_group", "init_process_group"]

log = logging.getLogger(__name__)


def init_process_group(**options: Any) -> None:
    """`dist.init_process_group(**options)`, with nothing in torch left to hold the group forever."""
    importlib.import_module("torch.distributed.nn.functional")  # its defaults capture None, not the group
    dist.init_process_group(**options)


def close_process_group() -> bool:
    """Destroy the default process group and free it now, ending its backend's threads.

    Call it where the objects that held the group (model, DDP, optimizer)
    are gone. Returns True when the group was freed here (or there was
    none); False, with a warning, when a Python reference still holds it.
    """
    if not dist.is_initialized():
        return True
    group = dist.group.WORLD
    gc.collect()  # modules, DDP's hooks and autograd graphs hold the group in reference cycles
    shm_exchange.close_all()  # its files go with the group
    dist.destroy_process_group()
    others = sys.getrefcount(group) - 2  # `group` here and getrefcount's own argument
    if others:
        log.warning(
            "reccompile: %d reference(s) still hold the process group after destroy_process_group; "
            "its threads outlive it and may abort the interpreter's exit",
            others,
        )
    return others == 0
