"""seq-bench: the sequence-model training workload, through the normal compiler path.

Compiles specs/bench/seq_bench.yaml (a user bag, a target item and a 1-50
item history sharing one 1M x 64 table, a transformer layer over [target,
history], an MLP), imports the generated module, and trains it on the
workload's reference batches (../shared/bench/seq_workload.py, bit-identical
to what the TorchRec anchor torchrec_seq_bench.py sees). Prints one JSON line
per run, the schema of ../shared/bench/WORKLOAD.md with "variant": "seq",
plus the extras of dlrm_bench.py (`cpu`, `cpu_flags`, `kernels`, ...).

    python benchmarks/seq_bench.py                        # one process
    python benchmarks/seq_bench.py --mode dist2           # two ranks over gloo, one thread each
    python benchmarks/seq_bench.py --profile prof/        # where the time goes

Threads, pipeline and `--pipeline ab` as in dlrm_bench.py (benchmarks/harness.py).
"""

from __future__ import annotations

import argparse
import json
import os
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

SPEC = harness.REPO / "specs" / "bench" / "seq_bench.yaml"


def compile_module(world_size: int, outdir: str) -> Path:
    return harness.compile_spec(SPEC, world_size, outdir)


def make_batches(module: ModuleType, rank: int) -> list[Any]:
    """The workload's pre-generated batches as the compiled model's Batch objects.

    The spec's features are the workload's arrays by name: user_id and item_id one id per
    sample, item_history its jagged ids.
    """
    from runtime.data.batch import Batch
    from runtime.sparse.jagged import KeyedJaggedTensor

    workload = harness.load_reference("seq_workload")
    inputs = module.INPUTS
    label = inputs.heads[0].label
    keys = [feature.name for feature in inputs.sparse]
    batches = []
    for index in range(workload.NUM_BATCHES):
        user, item, lengths, history, labels = workload.make_batch(index, rank)
        ones = np.ones_like(lengths)
        by_name = {"user_id": (user, ones), "item_id": (item, ones), "item_history": (history, lengths)}
        if sorted(keys) != sorted(by_name):
            raise SystemExit(f"error: {SPEC.name} has sparse features {keys}; the workload feeds {sorted(by_name)}")
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.from_numpy(np.concatenate([by_name[key][0] for key in keys])),
            lengths=torch.from_numpy(np.concatenate([by_name[key][1] for key in keys])),
        )
        batches.append(Batch(dense={}, sparse=sparse, labels={label: torch.from_numpy(labels)}))
    return batches


def seq_workload() -> harness.Workload:
    workload = harness.load_reference("seq_workload")
    return harness.Workload(
        variant="seq",
        batch_size=workload.BATCH_SIZE,
        model_seed=workload.MODEL_SEED,
        compile=compile_module,
        batches=make_batches,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_run_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.bench_cache()
    from runtime.cpu import choice

    workload = seq_workload()
    reference = harness.load_reference("seq_workload")
    harness.settle_defaults(args)
    if args.steps is None:
        args.steps = reference.DEFAULT_STEPS
    for _ in range(args.repeat):
        for summary in harness.run(args, workload):
            print(json.dumps({**choice.machine(), **summary}), flush=True)  # the summary keeps its ranks' kernels
    return 0


if __name__ == "__main__":
    sys.exit(main())
