"""runtime/train/process_group.py: the process group, and gloo's threads, end before the interpreter does.

Issue 15: a gloo worker thread that releases a collective's tensors while the
interpreter finalizes aborts the rank (`terminate called without an active
exception`). These tests check what rules that out: after
close_process_group() the group is freed and no gloo thread is left, even
when DDP (which imports torch.distributed.nn.functional, whose defaults
would hold the group) ran after the group was made.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from runtime.train.process_group import close_process_group, init_process_group
import rendezvous

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="thread names are read from /proc/self/task (Linux)"
)


def _gloo_threads() -> list[str]:
    """Names of this process's threads that belong to gloo or its TCP store."""
    names = (task.read_text().strip() for task in Path("/proc/self/task").glob("*/comm"))
    return sorted(name for name in names if "gloo" in name or "tcpstore" in name)


def _rank(rank: int, port: int, out: str) -> None:
    rendezvous.join_gloo(rank, port)
    running = _gloo_threads()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))  # the first DDP imports torch.distributed.nn.functional
    model(torch.ones(8, 4)).sum().backward()
    gathered: list[object] = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})  # the last collective, as dlrm_bench's ranks end
    del model
    freed = close_process_group()
    Path(f"{out}.{rank}").write_text(
        json.dumps({"running": bool(running), "freed": freed, "left": _gloo_threads(), "gathered": gathered})
    )


def test_two_ranks_end_their_gloo_threads_before_exit(tmp_path: Path) -> None:
    out = tmp_path / "rank"
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(out)), nprocs=2, join=True)
    for rank in range(2):
        assert json.loads(Path(f"{out}.{rank}").read_text()) == {
            "running": True,
            "freed": True,
            "left": [],
            "gathered": [{"rank": 0}, {"rank": 1}],
        }


def test_a_group_something_still_holds_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert close_process_group() is True  # no group: nothing to do
    init_process_group(backend="gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    held = dist.group.WORLD
    with caplog.at_level(logging.WARNING, logger="runtime.train.process_group"):
        assert close_process_group() is False
    assert not dist.is_initialized()
    assert caplog.messages == [
        "reccompile: 1 reference(s) still hold the process group after destroy_process_group; "
        "its threads outlive it and may abort the interpreter's exit"
    ]
    assert _gloo_threads() != []  # the holder keeps the backend, and its threads, alive
    del held
    assert _gloo_threads() == []
