"""A small compiled model, its training, and the rank entry points of the checkpoint tests.

The spec has one table per sharding type (row_wise, column_wise, table_wise,
data_parallel, table_row_wise) with rowwise_adagrad, so the column-split
rowwise state is covered too. Modules are compiled for each world size the
tests use; ranks are started with torch.multiprocessing.spawn over gloo on a
loopback port, and rank 0 writes what the test compares to a .pt file.
"""

from __future__ import annotations

import datetime
import itertools
import time
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist

from runtime.checkpoint import store as checkpoint
from runtime.sharding import distribute_dense
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.context import RunContext
from runtime.train.loop import train
from runtime.train.options import TrainOptions
from runtime.train.worker import load_module
from runtime.train.process_group import close_process_group, init_process_group
import rendezvous

BATCH = 64
SAVED_AT = 5
STEPS = 10

SPEC = """\
version: 1
name: ckpt_tiny
features:
  dense:
    - {name: int, size: 4}
  sparse:
    - {name: a, num_embeddings: 50, dim: 8}
    - {name: b, num_embeddings: 40, dim: 8, pooling: mean}
    - {name: c, num_embeddings: 30, dim: 8}
    - {name: d, num_embeddings: 20, dim: 8}
    - {name: e, num_embeddings: 10, dim: 8}
model:
  bottom: {type: mlp, input: dense.int, layers: [16, 8]}
  interaction: {type: dot, input: [bottom, sparse.*]}
  top: {type: mlp, input: [bottom, interaction], layers: [16, 1]}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 64
  steps: 10
  dense_optimizer: {type: adagrad, lr: 0.05}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}
sharding:
  constraints:
    a: {sharding_types: [row_wise]}
    b: {sharding_types: [column_wise]}
    c: {sharding_types: [table_wise]}
    d: {sharding_types: [data_parallel]}
    e: {sharding_types: [table_row_wise]}
"""


def compile_modules(directory: Path, world_sizes: tuple[int, ...], spec: str = SPEC) -> dict[int, Path]:
    """`spec` written to `directory` and compiled once per world size (into `directory`/ws<N>)."""
    from compiler.codegen.emit import emit
    from compiler.pipeline import Options, compile_spec

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ckpt_tiny.yaml"
    path.write_text(spec)
    return {n: emit(compile_spec(str(path), Options(world_size=n))).write(directory / f"ws{n}")[0] for n in world_sizes}


def fresh(module: ModuleType, process_group: dist.ProcessGroup | None = None):
    """The model (its dense part in DDP on several ranks) and dense optimizer, as the worker has them."""
    torch.manual_seed(module.INPUTS.training.seed)
    model = module.build(process_group=process_group)
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    return distribute_dense(model, process_group), optimizer


def run_steps(
    module: ModuleType,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    start: int,
    stop: int,
    process_group: dist.ProcessGroup | None = None,
) -> list[float]:
    """Steps start+1 .. stop on the module's synthetic batches; the global losses."""
    rank = dist.get_rank(process_group) if process_group is not None else 0
    world_size = dist.get_world_size(process_group) if process_group is not None else 1
    batches = (
        module.synthetic_batch(BATCH, step=step, rank=rank, world_size=world_size) for step in itertools.count(start)
    )
    options = TrainOptions(module=module.__file__, steps=stop, batch_size=BATCH, pipeline=False)
    context = RunContext(options, module.INPUTS, process_group=process_group)
    summary = train(context, model, batches, optimizer, start_step=start)
    return list(summary.losses)


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Whole tables (gathered; a collective) and the dense entries, as one process holds them."""
    model = getattr(model, "module", model)
    state = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("sparse_arch.")}
    state.update({f"sparse_arch.{k}": v for k, v in model.sparse_arch.full_state_dict().items()})
    return state


def init(rank: int, world_size: int, port: int) -> dist.ProcessGroup:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo",
        store=rendezvous.client(port, world_size, datetime.timedelta(seconds=60)),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    return dist.group.WORLD


def save_and_resume(rank: int, port: int, module_path: str, out: str) -> None:
    """Two ranks: train SAVED_AT steps and save, go on to STEPS; then a fresh model resumes.

    Rank 0 writes the losses of both, and the full state at the checkpoint.
    """
    group = init(rank, 2, port)
    module = load_module(module_path)
    model, optimizer = fresh(module, group)
    first = run_steps(module, model, optimizer, 0, SAVED_AT, group)
    checkpoint.save_checkpoint(
        Path(out) / "checkpoints",
        model,
        optimizer,
        step=SAVED_AT,
        spec_sha256=module.SPEC_SHA256,
        plan=module.PLAN,
        process_group=group,
    )
    saved = full_state(model)
    uninterrupted = run_steps(module, model, optimizer, SAVED_AT, STEPS, group)
    model, optimizer = fresh(module, group)
    resumed = checkpoint.load_checkpoint(
        Path(out) / "checkpoints", model, optimizer, spec_sha256=module.SPEC_SHA256, process_group=group
    )
    after = run_steps(module, model, optimizer, resumed.step, STEPS, group)
    if rank == 0:
        results = {"first": first, "uninterrupted": uninterrupted, "resumed": after, "saved": saved}
        torch.save(results, Path(out) / "results.pt")
    del model, optimizer  # DDP's reducer before its process group: the other order can hang at exit
    dist.barrier()
    close_process_group()


def load_at(rank: int, world_size: int, port: int, module_path: str, directory: str, out: str) -> None:
    """`world_size` ranks load the checkpoint in `directory`; rank 0 writes the full state."""
    group = init(rank, world_size, port)
    module = load_module(module_path)
    model, optimizer = fresh(module, group)
    sha256 = module.SPEC_SHA256
    checkpoint.load_checkpoint(directory, model, optimizer, spec_sha256=sha256, process_group=group)
    state = full_state(model)
    if rank == 0:
        torch.save(state, out)
    del model, optimizer  # DDP's reducer before its process group: the other order can hang at exit
    dist.barrier()
    close_process_group()


def worker_pids(marker: str, ranks: int = 2, timeout: float = 60.0) -> dict[int, int]:
    """{rank: pid} of the runtime.train.worker processes whose command line contains `marker`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"runtime.train.worker" not in argv or not any(marker.encode() in a for a in argv):
                    continue
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)
            if rank is not None:
                found[rank] = int(entry.name)
        if len(found) == ranks:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {ranks} worker processes for {marker}")
