"""gen-bench: next-item training at every position of jagged histories, through the normal compiler path.

Compiles specs/bench/gen_bench.yaml (one 2-100 item history in a 1M x 64
table, learned positions, two causal post-norm transformer layers, an
in-batch sampled softmax at every position) and trains it on the workload's
reference batches (../shared/bench/gen_workload.py, bit-identical to what the
TorchRec anchor torchrec_gen_bench.py sees). Prints one JSON line per run,
the schema of ../shared/bench/WORKLOAD.md with "variant": "gen", the extra
`positions_per_s` (rows of the loss per second, global) of GENERATIVE.md, and
the extras of dlrm_bench.py (`cpu`, `cpu_flags`, `kernels`, ...).

    python benchmarks/gen_bench.py                        # one process
    python benchmarks/gen_bench.py --mode dist2           # two ranks over gloo, one thread each
    python benchmarks/gen_bench.py --block hstu           # the same workload through the hstu block

`--block hstu` (specs/bench/gen_bench_hstu.yaml) reports HSTU's own cost on
these histories, not the anchor's model: its timestamps are one minute apart.
In dist2 each rank's negatives are the GLOBAL batch's next items (one process's
loss on the global batch, as every path of this project), where the anchor
takes each rank's local batch only.

Threads, pipeline and `--pipeline ab` as in dlrm_bench.py (benchmarks/harness.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's runtime and compiler
from runtime.cpu import openmp  # noqa: E402

openmp.training_environment(os.environ)  # as `reccompile train` does, before torch loads

import torch  # noqa: E402

import harness  # noqa: E402

SPECS = {
    "transformer": harness.REPO / "specs" / "bench" / "gen_bench.yaml",
    "hstu": harness.REPO / "specs" / "bench" / "gen_bench_hstu.yaml",
}
SECONDS_APART = 60  # --block hstu: position t of a history happened at 60 t


def compile_transformer(world_size: int, outdir: str) -> Path:
    return harness.compile_spec(SPECS["transformer"], world_size, outdir)


def compile_hstu(world_size: int, outdir: str) -> Path:
    return harness.compile_spec(SPECS["hstu"], world_size, outdir)


def make_batches(module: ModuleType, rank: int) -> list[Any]:
    """The workload's pre-generated batches as the compiled model's Batch objects (no labels: the
    targets are the history itself); a timestamps feature, if the spec has one, gets 60 t at position t."""
    from runtime.data.batch import Batch
    from runtime.sparse.jagged import KeyedJaggedTensor

    workload = harness.load_reference("gen_workload")
    inputs = module.INPUTS
    keys = [feature.name for feature in inputs.sparse] + [stamps.name for stamps in inputs.timestamps]
    if [feature.name for feature in inputs.sparse] != ["item_history"] or len(inputs.timestamps) > 1:
        raise SystemExit(f"error: the gen-bench spec has sparse features {keys}; the workload feeds item_history")
    batches = []
    for index in range(workload.NUM_BATCHES):
        lengths, history = workload.make_batch(index, rank)
        values, all_lengths = [history], [lengths]
        if inputs.timestamps:
            starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
            values.append((np.arange(history.shape[0]) - starts) * SECONDS_APART)
            all_lengths.append(lengths)
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.from_numpy(np.concatenate(values)),
            lengths=torch.from_numpy(np.concatenate(all_lengths)),
        )
        batches.append(Batch(dense={}, sparse=sparse, labels={}))
    return batches


def gen_workload(block: str) -> harness.Workload:
    workload = harness.load_reference("gen_workload")
    return harness.Workload(
        variant="gen",
        batch_size=workload.BATCH_SIZE,
        model_seed=workload.MODEL_SEED,
        compile=compile_transformer if block == "transformer" else compile_hstu,
        batches=make_batches,
    )


def mean_positions(world_size: int) -> float:
    """Rows of the loss per global batch, averaged over the cycled batches: sum over ranks of sum(L - 1)."""
    workload = harness.load_reference("gen_workload")
    per_batch = [
        sum(int(workload.make_batch(index, rank)[0].sum()) - workload.BATCH_SIZE for rank in range(world_size))
        for index in range(workload.NUM_BATCHES)
    ]
    return statistics.mean(per_batch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_run_arguments(parser)
    parser.add_argument(
        "--block",
        choices=sorted(SPECS),
        default="transformer",
        help="the sequence block: the workload's transformer, or hstu (its own cost)",
    )
    parser.set_defaults(warmup=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.bench_cache()
    from runtime.cpu import choice

    reference = harness.load_reference("gen_workload")
    workload = gen_workload(args.block)
    harness.settle_defaults(args)
    if args.steps is None:
        args.steps = reference.DEFAULT_STEPS
    if args.warmup is None:
        args.warmup = reference.DEFAULT_WARMUP
    positions = mean_positions(2 if args.mode == "dist2" else 1)
    for _ in range(args.repeat):
        for summary in harness.run(args, workload):
            extra = {"block": args.block, "positions_per_s": round(positions / (summary["step_ms_median"] / 1e3), 1)}
            print(json.dumps({**choice.machine(), **summary, **extra}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
