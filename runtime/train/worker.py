"""The training worker: `python -m runtime.train.worker MODULE.py [options]`.

`reccompile train` starts one of these per rank through torchrun (or runs it
in-process for one rank). It imports a generated module by path, builds the
model for this rank, and trains on the module's synthetic batches or on the
files `--data` names (see runtime.train.run_setup for the data and reporting
options). It needs only torch and the runtime: the compiler is not imported.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from runtime.train import checkpointing

from runtime.train import train_pipeline

from runtime.train import run_setup
from runtime.cpu.allocator import retain_freed_memory
from runtime.data.batch import Batch
from runtime.reporting import console
from runtime.sharding.dense import distribute_dense
from runtime.train.loop import make_dense_optimizer, train

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


def load_module(path: str) -> ModuleType:
    """Import a generated module from its file path."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"generated module {path} does not exist")
    spec = importlib.util.spec_from_file_location(file.stem, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def init_distributed(device_kind: str) -> dist.ProcessGroup | None:
    """The default process group when torchrun started several ranks, else None."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return None
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if device_kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return dist.group.WORLD


def synthetic_batches(
    module: ModuleType, batch_size: int, seed: int, rank: int, world_size: int, start: int = 0
) -> Iterator[Batch]:
    for step in itertools.count(start):
        yield module.synthetic_batch(batch_size, step=step, seed=seed, rank=rank, world_size=world_size)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m runtime.train.worker", description=__doc__)
    parser.add_argument("module", help="path of the generated module (<name>.py)")
    parser.add_argument("--steps", type=int, default=None, help="default: the spec's training.steps")
    parser.add_argument("--batch-size", type=int, default=None, help="global; default: the spec's")
    parser.add_argument("--seed", type=int, default=None, help="default: the spec's training.seed")
    parser.add_argument("--log-every", type=int, default=10)
    run_setup.add_arguments(parser)
    checkpointing.add_arguments(parser)
    train_pipeline.add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    retain_freed_memory()
    module = load_module(args.module)
    training = module.SPEC["training"]
    steps = args.steps if args.steps is not None else training["steps"]
    batch_size = args.batch_size if args.batch_size is not None else training["batch_size"]
    seed = args.seed if args.seed is not None else training["seed"]

    device_kind = module.SPEC["sharding"]["device"]
    process_group = init_distributed(device_kind)
    rank = dist.get_rank() if process_group is not None else 0
    world_size = dist.get_world_size() if process_group is not None else 1
    if batch_size % world_size != 0:
        raise ValueError(f"global batch size {batch_size} does not divide evenly over {world_size} ranks")
    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else None

    torch.manual_seed(seed)
    model = module.build(process_group=process_group, device=device)
    optimizer = make_dense_optimizer(training["dense_optimizer"], model.dense_parameters())
    checkpoints = checkpointing.Checkpointing(args, module, model, optimizer, process_group, rank)
    start_step = checkpoints.resume(steps)  # --resume, or a restart by torchrun
    # DDP for the dense part; the wrapper still offers `.loss` and `.dense_parameters()`.
    model = distribute_dense(model, process_group)
    run_io = run_setup.setup_run(
        args,
        module.SPEC,
        model=model,
        module_path=args.module,
        synthetic=lambda: synthetic_batches(module, batch_size, seed, rank, world_size, start_step),
        steps=steps,
        log_every=args.log_every,
        global_batch=batch_size,
        rank=rank,
        world_size=world_size,
        process_group=process_group,
        device=device,
    )
    batches = checkpoints.position(run_io.batches, args.data)
    depth = train_pipeline.depth_from_args(args, world_size)
    if device is not None and depth == 1:  # pipelined, the pipeline copies (pinned, ahead)
        batches = (b.to(device, non_blocking=True) for b in batches)

    summary = train(
        model,
        batches,
        steps=steps,
        optimizer=optimizer,
        global_batch_size=batch_size,
        log_every=args.log_every,
        on_log=run_io.monitor.on_log,
        on_step=checkpoints.chain(run_io.monitor.on_step),
        process_group=process_group,
        start_step=start_step,
        pipeline_depth=depth,
        device=device,
    )
    checkpoints.finish(steps)
    final = run_io.finish(summary.as_json())
    if rank == 0:
        console.result(final)
    if process_group is not None:
        dist.destroy_process_group()
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """`main`, with any error reported as one `error: rank R: ...` line and exit status 1.

    Under torchrun every failing rank reports; `reccompile train` shows each
    distinct message once. RECCOMPILE_TRACEBACK=1 prints the traceback too.
    """
    try:
        return main(argv)
    except Exception as error:  # the job must end with a message, never a bare traceback
        if os.environ.get("RECCOMPILE_TRACEBACK") == "1":
            traceback.print_exc()
        console.say(f"error: rank {os.environ.get('RANK', '0')}: {error}", sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run())
