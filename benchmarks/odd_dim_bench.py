"""A table whose dim is not a multiple of 4 (50, as hstu.yaml and sasrec.yaml publish): which kernel to train it on.

fbgemm's fused kernel stores rows of a multiple of 4 floats. The planner
gives such a table the `dense` kernel (torch.nn.EmbeddingBag and the sparse
optimizer); the alternative would be the fused kernel on the table padded to
the next multiple of 4, its output sliced back. This times one training step
of each (forward, backward with the optimizer's update in it) for a pooled
table (EmbeddingBagCollection) and a sequence table (EmbeddingCollection),
at hstu.yaml's size and at a larger one; the two are interleaved round by
round (A B A B ...) so machine noise hits both alike. One JSON line per case:

    {"bench": "odd_dim", "lookup": "pooled", "rows": 3953, ..., "dense_ms": 0.56, "fused_padded_ms": 0.52}

Usage: python benchmarks/odd_dim_bench.py [--threads 1] [--optimizer adagrad] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.config.embeddings import (
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbeddingOptimizer,  # noqa: E402
)
from runtime.embeddings.bag_collection import EmbeddingBagCollection  # noqa: E402
from runtime.embeddings.sequence_collection import EmbeddingCollection  # noqa: E402
from runtime.sparse.jagged import KeyedJaggedTensor  # noqa: E402

DIM, PADDED = 50, 52
CASES = (  # lookup, rows, batch, ids per sample
    ("pooled", 3953, 128, 1),
    ("pooled", 1_000_000, 2048, 20),
    ("sequence", 3953, 128, 200),
    ("sequence", 1_000_000, 512, 50),
)
BATCHES = 10


def collection(lookup: str, rows: int, dim: int, kernel: str, optimizer: EmbeddingOptimizer) -> torch.nn.Module:
    if lookup == "pooled":
        return EmbeddingBagCollection(
            [EmbeddingBagConfig("t", rows, dim, ["f"])], compute_kernel=kernel, optimizer=optimizer
        )
    return EmbeddingCollection([EmbeddingConfig("t", rows, dim, ["f"])], compute_kernel=kernel, optimizer=optimizer)


def case(lookup: str, rows: int, batch: int, ids: int, args: argparse.Namespace) -> dict:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.full((batch,), ids, dtype=torch.int32)
    kjts = [
        KeyedJaggedTensor.from_lengths_sync(["f"], torch.randint(0, rows, (batch * ids,), generator=gen), lengths)
        for _ in range(BATCHES)
    ]
    optimizer = EmbeddingOptimizer(args.optimizer, lr=0.01)
    models = {
        "dense": collection(lookup, rows, DIM, "dense", optimizer),
        "fused_padded": collection(lookup, rows, PADDED, "fused", optimizer),
    }
    counter = dict.fromkeys(models, 0)

    def step(name: str) -> float:
        kjt = kjts[counter[name] % BATCHES]
        counter[name] += 1
        start = time.perf_counter()
        out = models[name](kjt)
        values = out.values() if lookup == "pooled" else out["f"].values()
        values[:, :DIM].sum().backward()  # the padded columns are sliced off, as the model would
        return time.perf_counter() - start

    for name in models:
        for _ in range(args.warmup):
            step(name)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name in models:
            times[name].extend(step(name) for _ in range(args.steps_per_round))
    return {
        "bench": "odd_dim",
        "lookup": lookup,
        "rows": rows,
        "dim": DIM,
        "batch": batch,
        "ids": ids,
        "optimizer": args.optimizer,
        "threads": args.threads,
        **{f"{name}_ms": round(statistics.median(samples) * 1e3, 3) for name, samples in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--optimizer", default="adagrad", help="the tables' sparse optimizer (default adagrad)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps-per-round", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for lookup, rows, batch, ids in CASES:
        print(json.dumps(case(lookup, rows, batch, ids, args)), flush=True)


if __name__ == "__main__":
    main()
