"""Micro-benchmark of runtime/embeddings/bag_collection.py at DLRM-bench sizes.

Times one training step of the embeddings (forward, backward with the
row-wise Adagrad update in it) for the fused (fbgemm TBE) and the dense
(torch.nn.EmbeddingBag) kernels: 26 tables x 100,000 rows x 64, batch 2048,
`--ids` ids per feature. Pre-generated batches are cycled; the kernels are
interleaved round by round (A B A B ...) so machine noise hits both alike.
Prints one JSON line per kernel:

    {"bench": "embedding", "kernel": "fused", "step_ms_median": 7.1, ...}

Usage: python benchmarks/embedding_bench.py [--threads 1] [--ids 1] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.sparse.jagged import KeyedJaggedTensor

NUM_TABLES = 26
NUM_EMBEDDINGS = 100_000
DIM = 64
NUM_BATCHES = 20


def make_batches(batch: int, ids: int) -> list[KeyedJaggedTensor]:
    gen = torch.Generator().manual_seed(1234)
    keys = [f"f{i}" for i in range(NUM_TABLES)]
    lengths = torch.full((NUM_TABLES * batch,), ids, dtype=torch.int32)
    return [
        KeyedJaggedTensor.from_lengths_sync(
            keys,
            torch.randint(0, NUM_EMBEDDINGS, (NUM_TABLES * batch * ids,), generator=gen),
            lengths,
        )
        for _ in range(NUM_BATCHES)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--ids", type=int, default=1, help="ids per feature per sample")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--no-bounds-check", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    tables = [EmbeddingBagConfig(f"t{i}", NUM_EMBEDDINGS, DIM, [f"f{i}"]) for i in range(NUM_TABLES)]
    optimizer = EmbeddingOptimizer("rowwise_adagrad", lr=0.01, eps=1e-8)
    models = {
        kernel: EmbeddingBagCollection(
            tables,
            compute_kernel=kernel,
            optimizer=optimizer,
            bounds_check=not args.no_bounds_check,
        )
        for kernel in ("fused", "dense")
    }
    batches = make_batches(args.batch, args.ids)
    grad = torch.ones(args.batch, NUM_TABLES * DIM)
    counter = {kernel: 0 for kernel in models}

    def step(kernel: str) -> float:
        kjt = batches[counter[kernel] % NUM_BATCHES]
        counter[kernel] += 1
        start = time.perf_counter()
        models[kernel](kjt).values().backward(grad)
        return time.perf_counter() - start

    for kernel in models:
        for _ in range(args.warmup):
            step(kernel)
    times: dict[str, list[float]] = {kernel: [] for kernel in models}
    for _ in range(args.rounds):
        for kernel in models:
            times[kernel].extend(step(kernel) for _ in range(args.steps_per_round))
    for kernel, samples in times.items():
        print(
            json.dumps(
                {
                    "bench": "embedding",
                    "kernel": kernel,
                    "step_ms_median": round(statistics.median(samples) * 1e3, 2),
                    "step_ms_min": round(min(samples) * 1e3, 2),
                    "steps": len(samples),
                    "batch": args.batch,
                    "ids_per_feature": args.ids,
                    "threads": args.threads,
                    "bounds_check": not args.no_bounds_check,
                }
            )
        )


if __name__ == "__main__":
    main()
