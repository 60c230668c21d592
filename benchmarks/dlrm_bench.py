"""dlrm-bench: the standard training workload, through the normal compiler path.

Compiles specs/bench/dlrm_bench_<variant>.yaml, imports the generated module,
and trains it on the workload's reference batches (../shared/bench/workload.py,
bit-identical to what the TorchRec anchor sees). Prints one JSON line per run,
the schema of ../shared/bench/WORKLOAD.md plus a few extras.

    python benchmarks/dlrm_bench.py                       # both variants, local
    python benchmarks/dlrm_bench.py --variant criteo --mode dist2
    python benchmarks/dlrm_bench.py --mode dist2 --pipeline off    # the plain loop, to compare
    python benchmarks/dlrm_bench.py --mode dist2 --profile prof/   # where the time goes

dist2 trains through runtime.train.train_pipeline.TrainPipeline by default (`--pipeline
on`, as `reccompile train` does for several ranks): batch i+1's ids
all-to-all is in flight while batch i trains. `--pipeline ab` alternates
blocks of plain and pipelined steps in one run (a JSON line for each), so
both see the same noise of a shared machine.

Each line also carries the step's GEMM floor (benchmarks/gemm_floor.py): its
dense products timed alone with torch.mm at the run's threads, `gemm_floor_ms`,
with `dense_gflop` per step, this CPU's `sgemm_gflops` on them and
`step_over_floor`, the median step over that floor. And `cpu` (lscpu's model
name), `cpu_flags` (its vector features) and `kernels` (the kernel choices in
force, runtime/cpu/choice.py),
measured and kept under `$RECCOMPILE_CACHE_DIR/bench` apart from other runs'.
`RECCOMPILE_KERNELS=dot=torch,...` forces them for an A/B comparison.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's runtime and compiler
from runtime.cpu import openmp  # noqa: E402

openmp.training_environment(os.environ)  # as `reccompile train` does, before torch loads

import torch  # noqa: E402

import harness  # noqa: E402

REPO = harness.REPO


def compile_module(variant: str, world_size: int, outdir: str) -> Path:
    return harness.compile_spec(REPO / "specs" / "bench" / f"dlrm_bench_{variant}.yaml", world_size, outdir)


def make_batches(variant: str, module: ModuleType, rank: int) -> list[Any]:
    """The workload's pre-generated batches as the compiled model's Batch objects."""
    from runtime.data.batch import Batch
    from runtime.sparse.jagged import KeyedJaggedTensor

    workload = harness.load_reference("workload")
    inputs = module.INPUTS
    dense_name = inputs.dense[0].name
    label = inputs.heads[0].label
    keys = [feature.name for feature in inputs.sparse]
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
            Batch(dense={dense_name: torch.from_numpy(dense)}, sparse=sparse, labels={label: torch.from_numpy(labels)})
        )
    return batches


def dlrm_workload(variant: str) -> harness.Workload:
    workload = harness.load_reference("workload")
    return harness.Workload(
        variant=variant,
        batch_size=2048,
        model_seed=workload.MODEL_SEED,
        compile=functools.partial(compile_module, variant),
        batches=functools.partial(make_batches, variant),
        gemm_floor=True,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=["criteo", "multihot", "all"], default="all")
    harness.add_run_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.bench_cache()
    from runtime.cpu import choice

    workload = harness.load_reference("workload")
    harness.settle_defaults(args)
    variants = ["criteo", "multihot"] if args.variant == "all" else [args.variant]
    for variant in variants:
        for _ in range(args.repeat):
            run_args = argparse.Namespace(**{**vars(args), "variant": variant})
            if run_args.steps is None:
                run_args.steps = workload.DEFAULT_STEPS[variant]
            for summary in harness.run(run_args, dlrm_workload(variant)):
                print(json.dumps({**choice.machine(), **summary}), flush=True)  # the summary keeps its ranks' kernels
    return 0


if __name__ == "__main__":
    sys.exit(main())
