"""Micro-benchmark of runtime/embeddings/ids.py: the cost of checking a batch before the lookup.

dlrm-bench shapes: 26 features, batch 2048, `--ids` ids per sample, each
feature in its own table of 100,000 rows, ids drawn over all of it.
`--rows-step S` gives table k 100,000 - k*S rows: the id range then exceeds
the smallest table and the per-key comparison runs as well.
Fresh batches (no cached per-key counts), as the data readers yield them.
Prints one JSON line:

    {"bench": "id_check", "ids": 1, "check_us_median": 60.1, ...}

Usage: python benchmarks/id_check_bench.py [--ids 1] [--rows-step 0] [--threads 1] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from runtime.embeddings.ids import IdCheck
from runtime.sparse.jagged import KeyedJaggedTensor

NUM_FEATURES = 26
BATCH = 2048
NUM_EMBEDDINGS = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1)
    parser.add_argument("--rows-step", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keys = [f"f{i}" for i in range(NUM_FEATURES)]
    rows = [NUM_EMBEDDINGS - i * args.rows_step for i in range(NUM_FEATURES)]
    check = IdCheck(keys, [f"table 't{i}'" for i in range(NUM_FEATURES)], rows)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.full((NUM_FEATURES * BATCH,), args.ids, dtype=torch.int64)
    per_key = BATCH * args.ids
    values = torch.cat([torch.randint(0, r, (per_key,), generator=gen) for r in rows])
    times = []
    for _ in range(args.repeats):
        kjt = KeyedJaggedTensor(keys, values, lengths=lengths, stride=BATCH)
        started = time.perf_counter()
        check(kjt)
        times.append(time.perf_counter() - started)
    result = {
        "bench": "id_check",
        "features": NUM_FEATURES,
        "batch": BATCH,
        "ids": args.ids,
        "shared_rows": args.rows_step == 0,
        "threads": args.threads,
        "check_us_median": round(statistics.median(times) * 1e6, 1),
        "check_us_min": round(min(times) * 1e6, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
