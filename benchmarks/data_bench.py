"""data-bench: prepare throughput, and prepared reading per rank at N = 1, 2, 4 local processes.

Generates a Criteo-format TSV file of --rows rows (numpy, seeded), prepares
it for specs/dlrm_criteo.yaml (`reccompile data prepare`'s code, --workers
parsing processes) and reports rows/s. Then, for each N, starts N processes
at once, rank r of N reading its share of every global batch of one epoch
(runtime.data.prepared.batches, as `train --data prepared:DIR` does) and
reports per rank: rows/s of the rows it trains, and the rows it decoded
(which fall as 1/N when --row-group-rows divides batch / N). One JSON line
per result.

    python benchmarks/data_bench.py [--rows 2000000] [--ranks 1 2 4] [--batch-size 4096] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler.lowering.instantiate import model_inputs  # noqa: E402
from compiler.spec.load import load  # noqa: E402
from compiler.spec.validate import validate  # noqa: E402
from runtime.data.prepared.batches import PreparedBatches  # noqa: E402
from runtime.data.prepared.prepare import PrepareSettings, prepare  # noqa: E402
from runtime.data.prepared.reading import open_prepared  # noqa: E402
from runtime.data.sources import DataChoice  # noqa: E402

SPEC = Path(__file__).resolve().parent.parent / "specs" / "dlrm_criteo.yaml"


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
    results.put({"rank": rank, "rows_trained": rows, "rows_decoded": batches.decoded.rows,
                 "row_groups_decoded": len(batches.decoded.groups), "rows_per_s": round(rows / seconds)})  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--row-group-rows", type=int, default=512)
    parser.add_argument("--workers", type=int, default=1, help="parsing processes of the prepare")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/reccompile_data_bench"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    raw = args.workdir / f"criteo_{args.rows}.tsv"
    if not raw.is_file():
        write_criteo(raw, args.rows)
    out = args.workdir / "prepared"
    shutil.rmtree(out, ignore_errors=True)
    inputs = model_inputs(validate(load(str(SPEC))))
    settings = PrepareSettings(row_group_rows=args.row_group_rows, workers=args.workers)
    started = time.perf_counter()
    manifest = prepare(inputs, DataChoice("criteo", str(raw)), out, settings)
    seconds = time.perf_counter() - started
    print(json.dumps({"bench": "prepare", "rows": manifest.rows, "workers": args.workers, "seconds": round(seconds, 1),
                      "rows_per_s": round(manifest.rows / seconds)}), flush=True)  # fmt: skip
    context = multiprocessing.get_context("spawn")
    for world_size in args.ranks:
        results = context.Queue()
        ranks = [context.Process(target=read_share, args=(str(out), r, world_size, args.batch_size, results))
                 for r in range(world_size)]  # fmt: skip
        for process in ranks:
            process.start()
        shares = sorted((results.get() for _ in ranks), key=lambda r: r["rank"])
        for process in ranks:
            process.join()
        print(json.dumps({"bench": "prepared_read", "ranks": world_size, "batch_size": args.batch_size,
                          "row_group_rows": args.row_group_rows, "per_rank": shares}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
