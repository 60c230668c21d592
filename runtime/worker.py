"""The training worker: `python -m runtime.worker MODULE.py [options]`.

`reccompile train` starts one of these per rank through torchrun (or runs it
in-process for one rank). It imports a generated module by path, builds the
model for this rank, and trains on the module's synthetic batches. It needs
only torch and the runtime: the compiler is not imported.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from runtime.data.batch import Batch
from runtime.sharding.dense import distribute_dense
from runtime.train import StepLog, make_dense_optimizer, train

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
    module: ModuleType, batch_size: int, seed: int, rank: int, world_size: int
) -> Iterator[Batch]:
    for step in itertools.count():
        yield module.synthetic_batch(batch_size, step=step, seed=seed, rank=rank, world_size=world_size)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m runtime.worker", description=__doc__)
    parser.add_argument("module", help="path of the generated module (<name>.py)")
    parser.add_argument("--steps", type=int, default=None, help="default: the spec's training.steps")
    parser.add_argument("--batch-size", type=int, default=None, help="global; default: the spec's")
    parser.add_argument("--seed", type=int, default=None, help="default: the spec's training.seed")
    parser.add_argument("--log-every", type=int, default=10)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
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
        raise SystemExit(
            f"error: global batch size {batch_size} does not divide evenly over {world_size} ranks"
        )
    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else None

    torch.manual_seed(seed)
    model = module.build(process_group=process_group, device=device)
    optimizer = make_dense_optimizer(training["dense_optimizer"], model.dense_parameters())
    # DDP for the dense part; the wrapper still offers `.loss` and `.dense_parameters()`.
    model = distribute_dense(model, process_group)
    batches = synthetic_batches(module, batch_size, seed, rank, world_size)
    if device is not None:
        batches = (b.to(device, non_blocking=True) for b in batches)

    def log(entry: StepLog) -> None:
        if rank == 0:
            print(
                f"step {entry.step:>5}/{steps}  loss {entry.loss:.6f}  "
                f"samples/s {entry.samples_per_s:,.0f}",
                flush=True,
            )

    summary = train(
        model,
        batches,
        steps=steps,
        optimizer=optimizer,
        global_batch_size=batch_size,
        log_every=args.log_every,
        on_log=log,
        process_group=process_group,
    )
    if rank == 0:
        print(json.dumps(summary.as_json()), flush=True)
    if process_group is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
