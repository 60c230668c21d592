"""dlrm-bench: the standard training workload, through the normal compiler path.

Compiles specs/bench/dlrm_bench_<variant>.yaml, imports the generated module,
and trains it on the workload's reference batches (../shared/bench/workload.py,
bit-identical to what the TorchRec anchor sees). Prints one JSON line per run,
the schema of ../shared/bench/WORKLOAD.md plus a few extras.

    python benchmarks/dlrm_bench.py                       # both variants, local
    python benchmarks/dlrm_bench.py --variant criteo --mode dist2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent
WORKLOAD_DIR = REPO.parent / "shared" / "bench"


def load_workload() -> ModuleType:
    if not (WORKLOAD_DIR / "workload.py").is_file():
        raise SystemExit(f"error: {WORKLOAD_DIR / 'workload.py'} not found (the shared bench folder)")
    sys.path.insert(0, str(WORKLOAD_DIR))
    import workload

    return workload


def compile_module(variant: str, world_size: int, outdir: str) -> Path:
    from compiler.pipeline import Options, generate

    spec = REPO / "specs" / "bench" / f"dlrm_bench_{variant}.yaml"
    generated = generate(str(spec.relative_to(REPO)), Options(world_size=world_size))
    return generated.write(outdir)[0]


def make_batches(workload: ModuleType, module: ModuleType, variant: str, rank: int) -> list[Any]:
    """The workload's pre-generated batches as the compiled model's Batch objects."""
    from runtime.data.batch import Batch
    from runtime.jagged import KeyedJaggedTensor

    spec = module.SPEC
    dense_name = spec["dense"][0]["name"]
    label = spec["heads"][0]["label"]
    keys = [f["name"] for f in spec["sparse"]]
    batches = []
    for index in range(workload.NUM_BATCHES):
        dense, ids, labels = workload.make_batch(index, variant, rank=rank)
        per_sample = ids.shape[2]
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.from_numpy(ids.reshape(-1)),
            lengths=torch.full((ids.shape[0] * ids.shape[1],), per_sample, dtype=torch.long),
        )
        batches.append(
            Batch(dense={dense_name: torch.from_numpy(dense)}, sparse=sparse,
                  labels={label: torch.from_numpy(labels)})
        )
    return batches


def cpu_counters() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except OSError:
        return None
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6], sum(fields[:8])


def run_rank(args: argparse.Namespace, module_path: str, rank: int, world_size: int) -> dict[str, Any]:
    from runtime.train import make_dense_optimizer, train_step
    from runtime.worker import load_module

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    workload = load_workload()
    module = load_module(module_path)
    group = dist.group.WORLD if world_size > 1 else None
    torch.manual_seed(workload.MODEL_SEED)
    model = module.build(process_group=group)
    optimizer = make_dense_optimizer(module.SPEC["training"]["dense_optimizer"], model.dense_parameters())
    batches = make_batches(workload, module, args.variant, rank)
    losses, times = [], []
    for step in range(args.warmup):
        losses.append(train_step(model, optimizer, batches[step % len(batches)]))
    if group is not None:
        dist.barrier()
    usage_before, machine_before = resource.getrusage(resource.RUSAGE_SELF), cpu_counters()
    for step in range(args.warmup, args.warmup + args.steps):
        started = time.perf_counter()
        losses.append(train_step(model, optimizer, batches[step % len(batches)]))
        times.append(time.perf_counter() - started)
    usage_after, machine_after = resource.getrusage(resource.RUSAGE_SELF), cpu_counters()
    cpu_s = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    busy = total = None
    if machine_before and machine_after:
        hz = os.sysconf("SC_CLK_TCK")
        busy = (machine_after[0] - machine_before[0]) / hz
        total = (machine_after[1] - machine_before[1]) / hz
    return {
        "times": times,
        "loss_first": float(losses[0]),
        "loss_last": float(losses[-1]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "cpu_s": cpu_s,
        "machine_busy_s": busy,
        "machine_total_s": total,
        "threads": torch.get_num_threads(),
    }


def summarize(args: argparse.Namespace, world_size: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time = the slowest rank's per step; samples/s = global batch / median step."""
    step_s = [max(r["times"][i] for r in results) for i in range(len(results[0]["times"]))]
    median = statistics.median(step_s)
    global_batch = 2048 * world_size
    first = results[0]
    other = None
    if first["machine_busy_s"] is not None and first["machine_total_s"]:
        used = sum(r["cpu_s"] for r in results)
        other = round(max(0.0, 100.0 * (first["machine_busy_s"] - used) / first["machine_total_s"]), 1)
    return {
        "impl": "reccompile",
        "variant": args.variant,
        "mode": args.mode,
        "pipeline": False,
        "samples_per_s": round(global_batch / median, 1),
        "step_ms_median": round(median * 1e3, 3),
        "peak_rss_mb": round(sum(r["peak_rss_mb"] for r in results), 1),
        "loss_first": float(f"{first['loss_first']:.6g}"),
        "loss_last": float(f"{first['loss_last']:.6g}"),
        "world_size": world_size,
        "steps": args.steps,
        "threads_per_proc": first["threads"],
        "step_ms_min": round(min(step_s) * 1e3, 3),
        "other_cpu_pct": other,
    }


def _dist_rank(rank: int, world_size: int, port: int, args: argparse.Namespace, module_path: str, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = run_rank(args, module_path, rank, world_size)
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, result)
        if rank == 0:
            queue.put(gathered)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    world_size = 2 if args.mode == "dist2" else 1
    with tempfile.TemporaryDirectory() as outdir:
        module_path = str(compile_module(args.variant, world_size, outdir))
        if world_size == 1:
            return summarize(args, 1, [run_rank(args, module_path, 0, 1)])
        context = mp.get_context("spawn")
        queue = context.SimpleQueue()
        mp.start_processes(
            _dist_rank, args=(world_size, free_port(), args, module_path, queue),
            nprocs=world_size, start_method="spawn",
        )
        return summarize(args, world_size, queue.get())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=["criteo", "multihot", "all"], default="all")
    parser.add_argument("--mode", choices=["local", "dist2"], default="local")
    parser.add_argument("--steps", type=int, help="timed steps (default: the workload's per variant)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, help="intra-op threads per process (dist2 default: 1)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per variant")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workload = load_workload()
    if args.mode == "dist2" and args.threads is None:
        args.threads = 1  # two processes on two cores: one busy thread each
    variants = ["criteo", "multihot"] if args.variant == "all" else [args.variant]
    for variant in variants:
        for _ in range(args.repeat):
            run_args = argparse.Namespace(**{**vars(args), "variant": variant})
            if run_args.steps is None:
                run_args.steps = workload.DEFAULT_STEPS[variant]
            print(json.dumps(run(run_args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
