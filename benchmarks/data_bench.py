"""data-bench: prepare throughput, prepared reading per rank at N = 1, 2, 4, and the training step on it.

Generates --rows Criteo-format rows in --files TSV files (numpy, seeded) and
prepares them for specs/dlrm_criteo.yaml (`reccompile data prepare`'s code)
once per --prepare-workers value: `0` (line by line in one process), a
number, or `default` (chosen by the files and the usable cores,
runtime.data.prepared.parsing; its line names the choice), reporting
rows/s. Then, for each N, starts N processes at once, rank r of N reading
its share of every global batch of one epoch (runtime.data.prepared.batches,
as `train --data prepared:DIR` does) and reports per rank: rows/s of the
rows it trains, and the rows it decoded (which fall as 1/N when
--row-group-rows divides batch / N). Last, the dlrm-bench step
(specs/bench/dlrm_bench_criteo.yaml, one rank) on the same rows prepared for
it (row groups of --step-row-group-rows, prepare's default; kept in the
workdir for the next run), read by --data-workers DataLoader workers as
`reccompile train --data prepared:DIR` does, against the same model with the
same --threads on synthetic batches already in memory: blocks of --ab-block
steps alternate between the two so both see the same machine, and
`slowdown` is the prepared data's median step time over the synthetic
one's, minus 1 (the goal: at most 0.05). Wall time on a shared machine is
noisy, so the line also gives the load average and the CPU the data costs
per batch: in the training thread (taking a batch from the workers) and
reading in one thread alone (what a worker spends). One JSON line per
result, then a `data_summary` line with the figures the issue asks for
(prepare rows/s per --prepare-workers, each rank's decoded rows per N, the
step's medians and overhead in %, the CPU model and vector features; the
step's line also names the kernels chosen).

    python benchmarks/data_bench.py [--rows 2000000] [--files 2] [--prepare-workers 0 default] [--ranks 1 2 4]
                                    [--batch-size 4096] [--workdir DIR] [--skip-read] [--train-steps 200]
                                    [--ab-block 10] [--data-workers 1] [--threads T] [--step-row-group-rows 65536]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler.codegen.emit import emit  # noqa: E402
from compiler.lowering.instantiate import model_inputs  # noqa: E402
from compiler.pipeline import Options, compile_spec  # noqa: E402
from compiler.spec.load import load  # noqa: E402
from compiler.spec.validate import validate  # noqa: E402
from runtime.config.data import ModelInputs  # noqa: E402
from runtime.cpu.choice import machine  # noqa: E402
from runtime.data.batch import Batch  # noqa: E402
from runtime.data.prepared.batches import PreparedBatches  # noqa: E402
from runtime.data.prepared.prepare import PrepareSettings, prepare  # noqa: E402
from runtime.data.prepared.reading import open_prepared  # noqa: E402
from runtime.data.sources import DataChoice  # noqa: E402
from runtime.train.dense_optimizer import make_dense_optimizer  # noqa: E402
from runtime.train.loop import train_step  # noqa: E402
from runtime.train.worker import load_module  # noqa: E402

SPEC = Path(__file__).resolve().parent.parent / "specs" / "dlrm_criteo.yaml"
BENCH_SPEC = Path(__file__).resolve().parent.parent / "specs" / "bench" / "dlrm_bench_criteo.yaml"
SYNTHETIC_BATCHES = 8  # made before timing and cycled: no data cost at all


def write_criteo_files(directory: Path, rows: int, files: int) -> Path:
    """`rows` Criteo lines split over `files` files `day_<i>` in `directory` (made once, kept)."""
    if not (directory / ".complete").is_file():
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            write_criteo(directory / f"day_{i}", rows // files + (i < rows % files), seed=i)
        (directory / ".complete").touch()
    return directory


def write_criteo(path: Path, rows: int, seed: int = 0, chunk: int = 100_000) -> None:
    """`rows` Criteo lines: label, 13 integers (some empty), 26 hex values (some empty)."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as stream:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            labels = rng.integers(0, 2, n)
            ints = rng.integers(-2, 1000, (n, 13))
            cats = rng.integers(0, 2**32, (n, 26), dtype=np.uint64)
            empty = rng.random((n, 39)) < 0.05
            for i in range(n):
                fields = [str(labels[i])]
                fields += ["" if empty[i, j] else str(ints[i, j]) for j in range(13)]
                fields += ["" if empty[i, 13 + j] else format(int(cats[i, j]), "08x") for j in range(26)]
                stream.write("\t".join(fields) + "\n")


def read_share(directory: str, rank: int, world_size: int, batch: int, results: multiprocessing.Queue) -> None:
    inputs = model_inputs(validate(load(str(SPEC))))
    data = open_prepared(inputs, directory)
    batches = PreparedBatches(data, global_batch=batch, rank=rank, world_size=world_size, num_workers=0)
    steps = data.rows // batch
    started = time.perf_counter()
    for _ in range(steps):
        next(batches)
    seconds = time.perf_counter() - started
    batches.close()
    rows = steps * batch // world_size
    results.put(
        {
            "rank": rank,
            "rows_trained": rows,
            "rows_decoded": batches.decoded.rows,
            "row_groups_decoded": len(batches.decoded.groups),
            "rows_per_s": round(rows / seconds),
        }
    )


def training_step(raw: Path, args: argparse.Namespace) -> dict[str, object]:
    """dlrm-bench's criteo step on prepared data against synthetic batches in memory, alternating."""
    load_before = list(os.getloadavg())
    out = args.workdir / f"prepared_dlrm_bench_{raw.name}_{args.step_row_group_rows}"  # kept: a second run reuses it
    settings = PrepareSettings(row_group_rows=args.step_row_group_rows)
    prepare(model_inputs(validate(load(str(BENCH_SPEC)))), DataChoice("criteo", str(raw)), out, settings)
    torch.set_num_threads(args.threads)
    module = load_module(
        str(emit(compile_spec(str(BENCH_SPEC), Options(world_size=1))).write(args.workdir / "build")[0])
    )
    torch.manual_seed(0)
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    batch = args.batch_size
    synthetic = [module.synthetic_batch(batch, step=i, seed=0, rank=0, world_size=1) for i in range(SYNTHETIC_BATCHES)]
    prepared = PreparedBatches(
        open_prepared(module.INPUTS, out), global_batch=batch, rank=0, world_size=1, num_workers=args.data_workers
    )
    taking = [0.0]  # CPU seconds of the training thread in next(prepared)

    def take(step: int) -> Batch:
        started = time.thread_time()
        batch = next(prepared)
        taking[0] += time.thread_time() - started
        return batch

    sources = {"synthetic": lambda step: synthetic[step % SYNTHETIC_BATCHES], "prepared": take}
    times: dict[str, list[float]] = {name: [] for name in sources}
    for name in sources:  # warm-up: kernels chosen, allocator filled, the DataLoader workers started
        for step in range(args.ab_block):
            train_step(model, optimizer, sources[name](step))
    taking[0] = 0.0
    for block in range(max(1, args.train_steps // (2 * args.ab_block))):
        for name, source in sources.items():
            for step in range(args.ab_block):
                started = time.perf_counter()
                train_step(model, optimizer, source(block * args.ab_block + step))
                times[name].append(time.perf_counter() - started)
    prepared.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "bench": "dlrm_step",
        "spec": BENCH_SPEC.name,
        "batch_size": batch,
        "measured": f"one process, {args.threads} torch threads for both sources; blocks of {args.ab_block} "
        f"steps alternating synthetic/prepared after a block of each as warm-up; prepared data "
        f"read by {args.data_workers} DataLoader worker process(es) (0: in the training thread)",
        "data_workers": args.data_workers,
        "threads": args.threads,
        "cores": len(os.sched_getaffinity(0)),
        "row_group_rows": args.step_row_group_rows,
        "steps_each": len(times["prepared"]),
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "median_ms": {name: round(1000 * value, 2) for name, value in median.items()},
        "slowdown": round(median["prepared"] / median["synthetic"] - 1, 4),
        "data_cpu_ms_per_batch": {
            "training_thread": round(1000 * taking[0] / len(times["prepared"]), 2),
            "reading_in_process": data_cpu_ms(module.INPUTS, out, batch),
        },
        **machine(),
    }


def data_cpu_ms(inputs: ModelInputs, directory: Path, batch: int, batches: int = 64) -> float:
    """CPU milliseconds per batch of reading prepared data in one thread (decode, columns, the batch):
    what a DataLoader worker spends, measured without a model beside it."""
    reader = PreparedBatches(open_prepared(inputs, directory), global_batch=batch, rank=0, world_size=1, num_workers=0)
    next(reader)
    started = time.process_time()
    for _ in range(batches):
        next(reader)
    return round(1000 * (time.process_time() - started) / batches, 2)


def prepare_once(raw: Path, out: Path, args: argparse.Namespace, workers: int | None) -> dict[str, object]:
    """One timed prepare of `raw` into `out` with `workers` parse processes (None: prepare's choice)."""
    shutil.rmtree(out, ignore_errors=True)
    inputs = model_inputs(validate(load(str(SPEC))))
    said: list[str] = []
    settings = PrepareSettings(row_group_rows=args.row_group_rows, workers=workers)
    load_before = list(os.getloadavg())
    started = time.perf_counter()
    manifest = prepare(inputs, DataChoice("criteo", str(raw)), out, settings, report=said.append)
    seconds = time.perf_counter() - started
    parsing = next(line.removeprefix("parsing ") for line in said if line.startswith("parsing "))
    return {
        "bench": "prepare",
        "rows": manifest.rows,
        "files": args.files,
        "workers": "default" if workers is None else workers,
        "parsing": parsing,
        "cores": len(os.sched_getaffinity(0)),
        "load_average_before": load_before,
        "seconds": round(seconds, 1),
        "rows_per_s": round(manifest.rows / seconds),
    }


def read_shares(out: Path, world_size: int, args: argparse.Namespace) -> dict[str, object]:
    """`world_size` processes at once, each reading its share of every batch of one epoch."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [
        context.Process(target=read_share, args=(str(out), r, world_size, args.batch_size, results))
        for r in range(world_size)
    ]
    for process in ranks:
        process.start()
    shares = sorted((results.get() for _ in ranks), key=lambda r: r["rank"])
    for process in ranks:
        process.join()
    return {
        "bench": "prepared_read",
        "ranks": world_size,
        "batch_size": args.batch_size,
        "row_group_rows": args.row_group_rows,
        "per_rank": shares,
    }


def summary(prepares: list[dict], reads: list[dict], step: dict | None) -> dict[str, object]:
    """The closing figures in one object: prepare rows/s, decoded rows per rank per N, the step's overhead."""
    decoded = {str(r["ranks"]): [share["rows_decoded"] for share in r["per_rank"]] for r in reads}
    line: dict[str, object] = {
        "bench": "data_summary",
        "prepare_rows_per_s": {str(p["workers"]): p["rows_per_s"] for p in prepares},
        "prepare_parsing": {str(p["workers"]): p["parsing"] for p in prepares},
        "rows_decoded_per_rank": decoded,
        "rows_per_s_per_rank": {str(r["ranks"]): [share["rows_per_s"] for share in r["per_rank"]] for r in reads},
    }
    if "1" in decoded:  # each rank of N decodes 1/N of what one process decodes (row groups dividing B / N)
        line["decoded_share_of_one_process"] = {n: round(max(rows) / decoded["1"][0], 4) for n, rows in decoded.items()}
    if step is not None:
        line["step_median_ms"] = step["median_ms"]
        line["step_overhead_pct"] = round(100 * step["slowdown"], 2)
        line["data_cpu_ms_per_batch"] = step["data_cpu_ms_per_batch"]
    facts = machine()
    return {**line, "cpu": facts["cpu"], "cpu_flags": facts["cpu_flags"]}  # the step's line has the kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=2, help="raw files the rows are split over")
    parser.add_argument(
        "--prepare-workers",
        type=workers_value,
        nargs="+",
        default=[0, None],
        metavar="W",
        help="prepare once per value: parse processes (0: line by line) or `default` (chosen)",
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--row-group-rows", type=int, default=512)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/reccompile_data_bench"))
    parser.add_argument("--train-steps", type=int, default=200, help="timed dlrm-bench steps, both sources together")
    parser.add_argument("--ab-block", type=int, default=10, help="steps per block of one source")
    parser.add_argument("--data-workers", type=int, default=1, help="DataLoader workers reading prepared data")
    parser.add_argument(
        "--step-row-group-rows",
        type=int,
        default=PrepareSettings().row_group_rows,
        help="row group rows of the data the training step reads (default: prepare's)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of the step")
    parser.add_argument("--skip-read", action="store_true", help="only the training step (no prepare or read bench)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    raw = write_criteo_files(args.workdir / f"criteo_{args.rows}x{args.files}", args.rows, args.files)
    prepares: list[dict] = []
    reads: list[dict] = []
    if not args.skip_read:
        out = args.workdir / "prepared"
        for workers in args.prepare_workers:
            prepares.append(prepare_once(raw, out, args, workers))
            print(json.dumps(prepares[-1]), flush=True)
        for world_size in args.ranks:
            reads.append(read_shares(out, world_size, args))
            print(json.dumps(reads[-1]), flush=True)
    step = None
    if args.train_steps > 0:
        step = training_step(raw, args)
        print(json.dumps(step), flush=True)
    print(json.dumps(summary(prepares, reads, step)), flush=True)
    return 0


def workers_value(text: str) -> int | None:
    """A --prepare-workers value: a count of 0 or more, or `default` (None)."""
    if text == "default":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count of 0 or more or 'default', got {text!r}")
    return int(text)


if __name__ == "__main__":
    sys.exit(main())
