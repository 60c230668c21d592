"""The timing harness the training benchmarks share (dlrm_bench.py, seq_bench.py).

A benchmark names its `Workload`: how to compile its spec through the normal
compiler path and how to turn the shared reference batches into the compiled
model's `Batch`es. The harness builds the model as `reccompile train` does,
times each full training step (forward, backward, optimizers) after the
warm-up, in one process or two over gloo, and summarises a run as one JSON
object in the schema of ../shared/bench/WORKLOAD.md: samples/s from the
median step of the slowest rank, peak RSS, the share of the machine other
processes used (`other_cpu_pct`), the process CPU per step (`cpu_ms_per_step`, all
threads and ranks, as the TorchRec anchor reports it), and with `--profile` the top ops per step.

The shared bench folder is ../shared/bench beside the checkout, or
`$RECCOMPILE_BENCH_WORKLOADS` (a worktree sits elsewhere).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import gemm_floor
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent
WORKLOADS_ENV = "RECCOMPILE_BENCH_WORKLOADS"


def workload_dir() -> Path:
    """The shared bench folder: `$RECCOMPILE_BENCH_WORKLOADS`, else ../shared/bench beside the checkout."""
    return Path(os.environ.get(WORKLOADS_ENV) or REPO.parent / "shared" / "bench")


def load_reference(name: str) -> ModuleType:
    """Imports the shared folder's `<name>.py` (the workload's constants and batch generator)."""
    folder = workload_dir()
    if not (folder / f"{name}.py").is_file():
        raise SystemExit(f"error: {folder / f'{name}.py'} not found (the shared bench folder; set {WORKLOADS_ENV})")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return __import__(name)


@dataclass(frozen=True)
class Workload:
    """What a benchmark trains: its spec (compiled per world size) and its batches per rank.

    `compile` and `batches` are module-level functions, so the spawned ranks can unpickle them.
    """

    variant: str
    batch_size: int  # per rank
    model_seed: int
    compile: Callable[[int, str], Path]  # (world size, output folder) -> the generated module
    batches: Callable[[ModuleType, int], list[Any]]  # (generated module, rank) -> its Batches
    gemm_floor: bool = False  # after the timed steps, one more step's products timed alone (gemm_floor.py)


# The device `run` compiles for (`--device`); compiling happens in the parent process, before the ranks start.
COMPILE_DEVICE = "cpu"


def compile_spec(spec: Path, world_size: int, outdir: str) -> Path:
    """The generated module of `spec` for `world_size` ranks, written into `outdir`; for
    COMPILE_DEVICE cuda from a copy of the spec with `sharding.device: cuda` (benchmark specs set no device)."""
    from compiler.pipeline import Options, generate

    path = str(spec.relative_to(REPO))
    if COMPILE_DEVICE != "cpu":
        text = spec.read_text()
        if "\nsharding:" in text:
            raise SystemExit(f"error: {path} has a sharding section; --device {COMPILE_DEVICE} sets its own")
        path = str(Path(outdir) / spec.name)
        Path(path).write_text(f"{text}\nsharding:\n  device: {COMPILE_DEVICE}\n")
    generated = generate(path, Options(world_size=world_size))
    return generated.write(outdir)[0]


def cpu_counters() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except OSError:
        return None
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6], sum(fields[:8])


def run_rank(
    args: argparse.Namespace, workload: Workload, module_path: str, rank: int, world_size: int
) -> dict[str, Any]:
    from runtime.cpu import choice
    from runtime.cpu.allocator import retain_freed_memory
    from runtime.sharding import distribute_dense
    from runtime.train.dense_optimizer import make_dense_optimizer
    from runtime.train.loop import train_step
    from runtime.train.train_pipeline import TrainPipeline
    from runtime.train.worker import load_module

    from runtime.train.precision import check_precision

    check_precision(args.precision, args.device)  # here, on the rank: where the CPU is known
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = None
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    retain_freed_memory()  # as runtime.train.worker does for `reccompile train`
    choice.forget_used()  # this run's kernels only, not an earlier run's in this process
    module = load_module(module_path)
    group = dist.group.WORLD if world_size > 1 else None
    torch.manual_seed(workload.model_seed)
    model = module.build(process_group=group, device=device)
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    model = distribute_dense(model, group)  # dense gradients averaged over the ranks, as in TorchRec
    batches = workload.batches(module, rank)
    if device is not None and args.pipeline == "off":
        batches = [batch.to(device) for batch in batches]  # the pipeline copies them itself

    def run_block(pipelined: bool, first: int, count: int, timed: dict[str, list[float]] | None) -> None:
        """Steps first..first+count-1, plain or through a pipeline that drains at the end."""
        if pipelined:
            if args.precision != "fp32":
                raise SystemExit(f"error: --precision {args.precision} runs the plain loop only: add --pipeline off")
            pipeline = TrainPipeline(model, optimizer, depth=args.pipeline_depth)
            source = (batches[i % len(batches)] for i in range(first, first + count))
            step_once = lambda step: pipeline.progress(source)[0]  # noqa: E731
        else:
            step_once = lambda step: train_step(  # noqa: E731
                model, optimizer, batches[step % len(batches)], args.precision
            )
        for step in range(first, first + count):
            started, cpu_started = time.perf_counter(), time.thread_time()
            losses.append(step_once(step))
            if device is not None:
                torch.cuda.synchronize(device)  # the step's kernels done, not only queued
            if timed is not None:
                timed["times"].append(time.perf_counter() - started)
                # wall time the main thread did not run: waits, collectives, peers, the scheduler
                timed["blocked"].append(timed["times"][-1] - (time.thread_time() - cpu_started))

    losses: list[torch.Tensor] = []
    run_block(args.pipeline != "off", 0, args.warmup, None)
    if group is not None:
        dist.barrier()
    timed = {mode: {"times": [], "blocked": []} for mode in modes(args)}
    profiler = start_profiler(args)
    usage_before, machine_before = resource.getrusage(resource.RUSAGE_SELF), cpu_counters()
    step = args.warmup
    for mode, count in schedule(args):
        run_block(mode == "on", step, count, timed[mode])
        step += count
    usage_after, machine_after = resource.getrusage(resource.RUSAGE_SELF), cpu_counters()
    profile = stop_profiler(profiler, args, workload, rank)
    kernels = choice.used()  # this rank's, taken here: dist2 ranks are processes of their own
    floor = None
    if workload.gemm_floor and args.device == "cpu":
        shapes = gemm_floor.gemm_shapes(lambda: train_step(model, optimizer, batches[0], args.precision))
        floor = gemm_floor.floor(shapes)
    cpu_s = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    busy = total = None
    if machine_before and machine_after:
        hz = os.sysconf("SC_CLK_TCK")
        busy = (machine_after[0] - machine_before[0]) / hz
        total = (machine_after[1] - machine_before[1]) / hz
    return {
        "timed": timed,
        "loss_first": float(losses[0]),
        "loss_last": float(losses[-1]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "cpu_s": cpu_s,
        "machine_busy_s": busy,
        "machine_total_s": total,
        "threads": torch.get_num_threads(),
        "profile": profile,
        "kernels": kernels,
        "gemm_floor": floor,
    }


def modes(args: argparse.Namespace) -> list[str]:
    return ["off", "on"] if args.pipeline == "ab" else [args.pipeline]


def schedule(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(mode, steps) blocks: one block, or `ab`'s alternating blocks of --ab-block steps each."""
    if args.pipeline != "ab":
        return [(args.pipeline, args.steps)]
    blocks = []
    for first in range(0, args.steps, args.ab_block):
        count = min(args.ab_block, args.steps - first)
        order = ("off", "on") if (first // args.ab_block) % 2 == 0 else ("on", "off")
        blocks += [(mode, count) for mode in order]
    return blocks


def start_profiler(args: argparse.Namespace) -> Any:
    if args.profile is None:
        return None
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    profiler.__enter__()
    return profiler


def stop_profiler(profiler: Any, args: argparse.Namespace, workload: Workload, rank: int) -> dict[str, Any] | None:
    """Per timed step: ms of the top ops by self time, of each pipeline stage, and of the
    collectives (from issue to completion, on gloo's threads); writes a chrome trace."""
    if profiler is None:
        return None
    profiler.__exit__(None, None, None)
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(out / f"{workload.variant}_{args.mode}_pipeline-{args.pipeline}_rank{rank}.json"))
    per_step = lambda us: round(us / 1e3 / args.steps, 3)  # noqa: E731
    averages = profiler.key_averages()
    by_self = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "top_self_ms": {e.key: per_step(e.self_cpu_time_total) for e in by_self[: args.profile_top]},
        "stage_ms": {e.key: per_step(e.cpu_time_total) for e in averages if e.key.startswith("## ")},
        "collective_ms": {e.key: per_step(e.cpu_time_total) for e in averages if e.key.startswith("gloo:")},
    }


def summarize(
    args: argparse.Namespace, workload: Workload, world_size: int, results: list[dict[str, Any]], mode: str
) -> dict[str, Any]:
    """Step time = the slowest rank's per step; samples/s = global batch / median step."""
    timed = [r["timed"][mode] for r in results]
    step_s = [max(t["times"][i] for t in timed) for i in range(len(timed[0]["times"]))]
    median = statistics.median(step_s)
    global_batch = workload.batch_size * world_size
    first = results[0]
    other = None
    if first["machine_busy_s"] is not None and first["machine_total_s"]:
        used = sum(r["cpu_s"] for r in results)
        other = round(max(0.0, 100.0 * (first["machine_busy_s"] - used) / first["machine_total_s"]), 1)
    return {
        "impl": "reccompile",
        "variant": workload.variant,
        "mode": args.mode,
        "pipeline": mode == "on",
        "samples_per_s": round(global_batch / median, 1),
        "step_ms_median": round(median * 1e3, 3),
        "peak_rss_mb": round(sum(r["peak_rss_mb"] for r in results), 1),
        "loss_first": float(f"{first['loss_first']:.6g}"),
        "loss_last": float(f"{first['loss_last']:.6g}"),
        "world_size": world_size,
        "steps": args.steps,
        "threads_per_proc": first["threads"],
        **({"precision": args.precision} if args.precision != "fp32" else {}),
        "step_ms_min": round(min(step_s) * 1e3, 3),
        # the spread of the steps, as torchrec_bench.py reports it: a run slow all through (p10 up too)
        # or a few slow steps (p90 only)
        "step_ms_p10_p90": [round(sorted(step_s)[int(q * (len(step_s) - 1))] * 1e3, 3) for q in (0.1, 0.9)],
        "blocked_ms_median": [round(statistics.median(t["blocked"]) * 1e3, 3) for t in timed],
        **({"ab_block": args.ab_block} if args.pipeline == "ab" else {}),
        "other_cpu_pct": other,
        # process CPU (user+sys, all threads, summed over ranks) per timed step, as torchrec_bench.py reports it
        **(
            {"cpu_ms_per_step": round(1e3 * sum(r["cpu_s"] for r in results) / len(step_s), 2)}
            if args.pipeline != "ab"
            else {}
        ),
        **({"profile": [r["profile"] for r in results]} if results[0]["profile"] else {}),
        **floor_fields(first["gemm_floor"], median),
        "kernels": merged_kernels([r["kernels"] for r in results]),
    }


def floor_fields(floor: dict[str, float] | None, step_s: float) -> dict[str, float]:
    """The GEMM floor's fields (gemm_floor.py, rank 0's) and the median step over it."""
    if not floor or not floor["gemm_floor_ms"]:
        return {}
    return {**floor, "step_over_floor": round(step_s * 1e3 / floor["gemm_floor_ms"], 2)}


def merged_kernels(each: list[dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
    """The kernel choices of several processes (ranks, measuring children) in one `choice.used()` mapping."""
    out: dict[str, dict[str, str]] = {}
    for kernels in each:
        for kernel, by_shape in kernels.items():
            out.setdefault(kernel, {}).update(by_shape)
    return {kernel: dict(sorted(by_shape.items())) for kernel, by_shape in sorted(out.items())}


def _dist_rank(
    rank: int, world_size: int, port: int, args: argparse.Namespace, workload: Workload, module_path: str, queue: Any
) -> None:
    from runtime.train.process_group import close_process_group, init_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_process_group(backend="nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world_size)
    try:
        result = run_rank(args, workload, module_path, rank, world_size)  # the model is gone when it returns
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, result)
        if rank == 0:
            queue.put(gathered)
    finally:
        close_process_group()  # gloo's threads end here, not in the interpreter's exit (issue 15)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(args: argparse.Namespace, workload: Workload) -> list[dict[str, Any]]:
    """One summary per mode run: one, or plain and pipelined for `--pipeline ab`."""
    global COMPILE_DEVICE
    world_size = 2 if args.mode == "dist2" else 1
    COMPILE_DEVICE = args.device
    with tempfile.TemporaryDirectory() as outdir:
        module_path = str(workload.compile(world_size, outdir))
        if world_size == 1:
            results = [run_rank(args, workload, module_path, 0, 1)]
        else:
            context = mp.get_context("spawn")
            queue = context.SimpleQueue()
            mp.start_processes(
                _dist_rank,
                args=(world_size, free_port(), args, workload, module_path, queue),
                nprocs=world_size,
                start_method="spawn",
            )
            results = queue.get()
        return [summarize(args, workload, world_size, results, mode) for mode in modes(args)]


def add_run_arguments(parser: argparse.ArgumentParser, modes: tuple[str, ...] = ("local", "dist2")) -> None:
    """The options every training benchmark takes (mode, steps, threads, pipeline, profile)."""
    parser.add_argument("--mode", choices=modes, default="local")
    parser.add_argument("--steps", type=int, help="timed steps (default: the workload's)")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: the dense layers under autocast, fp32 weights and tables (runtime.train.precision)",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: the spec compiled for CUDA, rank r on GPU r, NCCL between ranks",
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        help="intra-op threads per process (local default: the cores free, as reccompile train; dist2: 1)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per variant")
    parser.add_argument(
        "--pipeline",
        choices=["on", "off", "ab"],
        help="train through runtime.train.train_pipeline.TrainPipeline (default: on for dist2, off for local); "
        "ab: alternate blocks of plain and pipelined steps in one run, a line for each",
    )
    parser.add_argument("--ab-block", type=int, default=5, help="steps per block with --pipeline ab")
    parser.add_argument("--pipeline-depth", type=int, default=2, help="with --pipeline on (default 2)")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="profile the timed steps (torch.profiler): chrome traces in DIR, per-step ms in the JSON line",
    )
    parser.add_argument("--profile-top", type=int, default=15, help="ops listed by self time")


def settle_defaults(args: argparse.Namespace) -> None:
    """Threads and pipeline as `reccompile train` would choose them; a bad combination exits."""
    from runtime.cpu.threads import choose_threads

    if args.mode == "dist2" and args.threads is None:
        args.threads = 1  # two processes on two cores: one busy thread each
    if args.mode == "local" and args.threads is None:
        args.threads = choose_threads(1, 0).threads  # the cores free now, as `reccompile train` chooses
    if args.pipeline is None:
        args.pipeline = "on" if args.mode == "dist2" else "off"  # as `reccompile train` chooses
    if args.pipeline == "ab" and args.profile is not None:
        raise SystemExit("error: --profile needs one mode: --pipeline on or off")


def bench_cache() -> None:
    """Keeps this benchmark's kernel choices apart from other runs' (each JSON line lists them all)."""
    if "RECCOMPILE_CACHE_DIR" not in os.environ:
        from runtime.cpu.native.build import cache_root

        os.environ["RECCOMPILE_CACHE_DIR"] = str(cache_root() / "bench")
