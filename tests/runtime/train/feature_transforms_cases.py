"""The two-rank run of tests/specs/valid/feature_transforms.yaml (fanned-out ids, bucketized columns,
position weights, tables on row_wise, data_parallel and table_wise): plain loop and pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import pipeline_cases as pc
from runtime.train.process_group import close_process_group
from runtime.train.worker import load_module
import rendezvous


def run_ranks(rank: int, port: int, path: str, out: str) -> None:
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
    module = load_module(path)
    results: dict[str, Any] = {}
    for mode, depth in (("plain", None), ("depth2", 2)):
        result = pc.train_case(module, dist.group.WORLD, rank, 2, depth)
        both: list[Any] = [None, None]
        dist.all_gather_object(both, result["losses"])
        result["losses"] = torch.stack(both).mean(0)  # each rank's loss is the mean of its half
        results[mode] = result
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    close_process_group()
