"""The ranks of tests/runtime/train/test_feature_state_ranks.py: each resolves the learned features of a run."""

from __future__ import annotations

import datetime
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import destroy_process_group, init_process_group

import rendezvous
from compiler.lowering.instantiate import model_inputs
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.sources import DataChoice
from runtime.train.feature_state import learned_inputs


def resolve(rank: int, port: int, spec: str, data: str, out: str) -> None:
    """Rank 0 reads `data`; rank 1 is given a path that does not exist, so it can only get the state from rank 0."""
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo",
        store=rendezvous.client(port, 2, datetime.timedelta(seconds=60)),
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    inputs = model_inputs(validate(load(spec)))
    choice = DataChoice("csv", data if rank == 0 else str(Path(out) / "missing.csv"))
    module = Path(out) / f"rank{rank}" / "model.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    learned = learned_inputs(
        inputs, choice, module_file=module, resumed=None, rank=rank, process_group=dist.group.WORLD
    )
    (Path(out) / f"rank{rank}.json").write_bytes(learned.learned.to_bytes())
    destroy_process_group()
