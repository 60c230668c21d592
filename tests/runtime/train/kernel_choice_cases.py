"""Rank entry points of the kernel-choice tests: two gloo ranks choosing one site, in a run."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

import checkpoint_cases as cc
from runtime.cpu import choice
from runtime.train import kernel_choices
from runtime.train.process_group import close_process_group

SITE = "in8_out4_fwdbwd"


def _sleeper(ms: float) -> Callable[[], None]:
    return lambda: time.sleep(ms / 1e3)


def choose_apart(rank: int, port: int, caches: list[str], out: str) -> None:
    """Each rank times the two linears so that *its* measurement picks another winner than the other rank's.

    Rank 0 finds oneDNN 15x faster, rank 1 aten: what each runs is the run's
    agreed choice only if the ranks take one decision. With `caches[rank]`
    as each rank's RECCOMPILE_CACHE_DIR. Rank 0 writes what each rank ran and
    what a checkpoint would record to `out` (JSON).
    """
    os.environ["RECCOMPILE_CACHE_DIR"] = caches[rank]
    group = cc.init(rank, 2, port)
    fast, slow = ("onednn", "aten") if rank == 0 else ("aten", "onednn")
    with choice.run():
        kernel_choices.share(group)
        dist.barrier()  # both measure at once when neither knows the site
        ran = choice.choose("linear", f"b{64 << rank}_{SITE}_t1", {fast: _sleeper(1), slow: _sleeper(15)}, site=SITE)
        every: list[str | None] = [None, None]
        dist.all_gather_object(every, ran)
        kept, differences = kernel_choices.gather(group)
    if rank == 0:
        Path(out).write_text(json.dumps({"ran": every, "kept": kept, "differences": differences}))
    dist.barrier()
    close_process_group()
