"""A compiled spec with batch norm, dropout and residuals, and the rank entry point of its two-rank run.

Used by test_norm_dropout_ranks.py: the spec is compiled for world sizes 1
and 2 (tests/runtime/checkpoint/checkpoint_cases.py compiles and trains),
two ranks started with torch.multiprocessing.spawn over gloo train STEPS
steps, and rank 0 writes the global losses and the full state to a .pt file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime" / "checkpoint"))
import checkpoint_cases as cc  # noqa: E402
from runtime.train.process_group import close_process_group  # noqa: E402
from runtime.train.worker import load_module  # noqa: E402

STEPS = 6
SPEC = """\
version: 1
name: ckpt_tiny
features:
  dense:
    - {name: int, size: 8}
  sparse:
    - {name: a, num_embeddings: 50, dim: 8}
    - {name: b, num_embeddings: 40, dim: 8}
    - {name: c, num_embeddings: 30, dim: 8}
model:
  bottom: {type: mlp, input: dense.int, layers: [16, 8], norm: batch, dropout: 0.2, residual: true}
  interaction: {type: dot, input: [bottom, sparse.*]}
  top: {type: mlp, input: [bottom, interaction], layers: [32, 16, 1], norm: batch, dropout: 0.3, residual: true}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 64
  steps: 6
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}
sharding:
  constraints:
    a: {sharding_types: [row_wise]}
    b: {sharding_types: [table_wise]}
    c: {sharding_types: [data_parallel]}
"""


def train_run(module_path: str, group: dist.ProcessGroup | None = None) -> dict:
    """STEPS steps from a fresh model: the global losses and the full state (a collective on ranks)."""
    module = load_module(module_path)
    model, optimizer = cc.fresh(module, group)
    losses = cc.run_steps(module, model, optimizer, 0, STEPS, group)
    result = {"losses": losses, "state": cc.full_state(model)}
    del model, optimizer  # DDP's reducer before its process group
    return result


def run(rank: int, port: int, module_path: str, out: str) -> None:
    group = cc.init(rank, 2, port)
    result = train_run(module_path, group)
    if rank == 0:
        torch.save(result, Path(out) / "results.pt")
    dist.barrier()
    close_process_group()
