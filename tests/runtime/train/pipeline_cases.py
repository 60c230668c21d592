"""The pipeline tests' spec, one variant per sharding type, and the training loops they compare.

`spec_text(case)` is a small DLRM whose five tables (a mean-pooled one, a
weighted one, multi-hot ones) all take one sharding type, or one type each
(`mixed`), through the spec's `sharding.constraints`, so the compiler emits
the stages of every type. The rank entry point trains each compiled module
twice at two ranks over gloo, with the plain loop and with the pipeline, and
rank 0 saves both ranks' losses, the full tables and the dense state.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from runtime.train.train_pipeline import TrainPipeline
from runtime.sharding import distribute_dense
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.loop import train_step
from runtime.train.worker import load_module
from runtime.train.process_group import close_process_group
import rendezvous

SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")
CASES = (*SHARDING_TYPES, "mixed")
TABLES = ("a", "b", "c", "d", "e")
GLOBAL_BATCH = 16
STEPS = 6
SEED = 0

SPEC = """\
version: 1
name: pipelined_{case}
features:
  dense:
    - {{name: num, size: 4}}
  sparse:
    - {{name: a, num_embeddings: 60, dim: 8}}
    - {{name: b, num_embeddings: 40, dim: 8, pooling: mean, max_ids_per_sample: 4}}
    - {{name: c, num_embeddings: 50, dim: 8, weighted: true, max_ids_per_sample: 3}}
    - {{name: d, num_embeddings: 30, dim: 8}}
    - {{name: e, num_embeddings: 20, dim: 8, max_ids_per_sample: 2}}
model:
  bottom: {{type: mlp, input: dense.num, layers: [8]}}
  interaction: {{type: dot, input: [bottom, sparse.*]}}
  top: {{type: mlp, input: [bottom, interaction], layers: [8, 1]}}
heads:
  - {{name: click, input: top, loss: bce}}
training:
  batch_size: {batch}
  dense_optimizer: {{type: adagrad, lr: 0.05}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
sharding:
  constraints:
{constraints}
"""


def spec_text(case: str) -> str:
    types = SHARDING_TYPES if case == "mixed" else (case,) * len(TABLES)
    constraints = "\n".join(f"    {table}: {{sharding_types: [{kind}]}}" for table, kind in zip(TABLES, types))
    return SPEC.format(case=case, batch=GLOBAL_BATCH, constraints=constraints)


def train_case(
    module: ModuleType,
    process_group: dist.ProcessGroup | None,
    rank: int,
    world_size: int,
    depth: int | None,
) -> dict[str, Any]:
    """STEPS steps from the same initial state: the plain loop (depth None) or the pipeline."""
    torch.manual_seed(SEED)
    model = module.build(process_group=process_group)
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    trained = distribute_dense(model, process_group)
    batches = [module.synthetic_batch(GLOBAL_BATCH, step=i, rank=rank, world_size=world_size) for i in range(STEPS)]
    if depth is None:
        losses = [train_step(trained, optimizer, batch) for batch in batches]
        drained = True
    else:
        pipeline = TrainPipeline(trained, optimizer, depth=depth)
        source = iter(batches)
        losses = [pipeline.progress(source)[0] for _ in batches]
        try:
            pipeline.progress(source)
            drained = False
        except StopIteration:
            drained = True
    return {
        "losses": torch.stack(losses),
        "drained": drained,
        "tables": model.sparse_arch.full_state_dict(),
        "dense": {
            name: value.detach().clone()
            for name, value in model.state_dict().items()
            if not name.startswith("sparse_arch.")
        },
    }


def run_ranks(rank: int, port: int, paths: dict[str, str], out: str) -> None:
    """Every case at two ranks, plain then pipelined (depth 2, and 3 for `mixed`)."""
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
    group = dist.group.WORLD
    results: dict[str, Any] = {}
    for case, path in paths.items():
        module = load_module(path)
        depths = {"plain": None, "depth2": 2} | ({"depth3": 3} if case == "mixed" else {})
        results[case] = {}
        for mode, depth in depths.items():
            result = train_case(module, group, rank, 2, depth)
            both: list[Any] = [None, None]
            dist.all_gather_object(both, (result["losses"], result["drained"]), group=group)
            result["losses"] = [losses for losses, _ in both]
            result["drained"] = all(drained for _, drained in both)
            results[case][mode] = result
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    close_process_group()
