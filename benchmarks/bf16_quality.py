"""bf16 training's quality cost: the inference-bench quality set, trained in fp32 and in bf16.

The issue's rule for `training.precision: bf16`: keep it only where the
held-out AUC moves by at most 0.001 from fp32's. This trains
specs/bench/dlrm_bench_criteo.yaml at world size 1 from the same seed on the
same synthetic batches (runtime.data.synthetic.batches, the learnable signal
inference_bench.py trains on), once per precision, then scores the held-out
batches inference_bench.py's quality step scores (steps the training never
draws) with the trained model in fp32, and prints one JSON line per
precision (AUC, NE, final training loss, seconds) and one with the changes.

    python benchmarks/bf16_quality.py                     # 100 steps, as inference_bench's --train-steps
    python benchmarks/bf16_quality.py --train-steps 400 --eval-batches 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's runtime and compiler
from runtime.cpu import openmp

openmp.training_environment(os.environ)  # as `reccompile train` does, before torch loads

import harness  # noqa: E402
import torch  # noqa: E402
from inference_bench import HELD_OUT_STEP, SPEC  # noqa: E402

PRECISIONS = ("fp32", "bf16")


def train_and_score(module_path: str, precision: str, steps: int, eval_batches: int) -> dict[str, Any]:
    """Trains a fresh model for `steps` steps in `precision`; AUC and NE on the held-out batches."""
    from runtime.data.synthetic.batches import make_batch
    from runtime.reporting.metrics import auc, normalized_entropy
    from runtime.train.dense_optimizer import make_dense_optimizer
    from runtime.train.loop import train_step
    from runtime.train.precision import check_precision
    from runtime.train.worker import load_module

    check_precision(precision)
    module = load_module(module_path)
    torch.manual_seed(harness.load_reference("workload").MODEL_SEED)
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    inputs = module.INPUTS
    started = time.perf_counter()
    for step in range(steps):
        loss = train_step(
            model, optimizer, make_batch(inputs, inputs.training.batch_size, step, inputs.training.seed), precision
        )
    seconds = time.perf_counter() - started
    model.eval()
    logits, labels = [], []
    with torch.no_grad():  # the training lookup has no inference-mode path
        for k in range(eval_batches):
            batch = make_batch(inputs, inputs.training.batch_size, HELD_OUT_STEP + k, inputs.training.seed)
            logits.append(model(batch.dense, batch.sparse)["click"])
            labels.append(batch.labels["click"])
    logit, label = torch.cat(logits).double(), torch.cat(labels).double()
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logit, label, reduction="sum")
    return {
        "precision": precision,
        "train_steps": steps,
        "loss_last": float(loss),
        "train_s": round(seconds, 1),
        "auc": auc(torch.sigmoid(logit), label),
        "ne": normalized_entropy(float(bce), float(label.sum()), label.numel()),
        "eval_samples": label.numel(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-steps", type=int, default=100, help="as inference_bench.py's default")
    parser.add_argument("--eval-batches", type=int, default=10, help="held-out batches of the spec's batch size")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    harness.bench_cache()
    from compiler.pipeline import Options, generate

    with tempfile.TemporaryDirectory() as outdir:
        module_path = str(generate(str(harness.REPO / SPEC), Options(world_size=1)).write(outdir)[0])
        rows = {p: train_and_score(module_path, p, args.train_steps, args.eval_batches) for p in PRECISIONS}
    for row in rows.values():
        print(json.dumps(row), flush=True)
    fp32, bf16 = rows["fp32"], rows["bf16"]
    change = {
        "auc_change": bf16["auc"] - fp32["auc"],
        "ne_change": bf16["ne"] - fp32["ne"],
        "keep_bf16": abs(bf16["auc"] - fp32["auc"]) <= 0.001,
    }
    print(json.dumps(change), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
