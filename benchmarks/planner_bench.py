"""planner-bench (shared/bench/PLANNER.md): plan 1,000 tables on 8 and on 64 ranks.

Tables as in shared/bench/torchrec_planner_bench.py, same seed, so both
planners see the same set: rows log-uniform in 1e3..1e8, dims from
{16, 32, 64, 128, 256}, 1..50 ids per sample. Topology: cuda, 8 ranks per
host, batch 512 per rank. Each world size is planned with the device's
default memory per rank and with --roomy-memory per rank (so that memory
allows); one JSON line each: tables, ranks, memory per rank, seconds,
imbalance (slowest / mean rank) and gap (slowest rank / lower bound), or
the planner's diagnostic when the tables do not fit.

    python benchmarks/planner_bench.py [--tables 1000] [--ranks 8 64] [--roomy-memory 1TiB]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler.diagnostics import CompileError  # noqa: E402
from compiler.ir import Location, ModelIR, Optimizer, Sharding, SparseFeature, Table, Training  # noqa: E402
from compiler.planner.planner import plan, topology_from_ir  # noqa: E402
from compiler.planner.topology import format_bytes, parse_bytes  # noqa: E402

BATCH_PER_RANK = 512
RANKS_PER_HOST = 8


def bench_ir(num_tables: int, world_size: int, seed: int = 0) -> ModelIR:
    rng = random.Random(seed)
    here = Location("planner_bench", 1, 1)
    tables, features = [], []
    sparse_optimizer = Optimizer("rowwise_adagrad", 0.01)  # every table's, resolved as the IR has it
    for i in range(num_tables):
        rows = int(10 ** rng.uniform(3, 8))
        dim = rng.choice([16, 32, 64, 128, 256])
        ids = rng.randint(1, 50)
        tables.append(Table(f"t{i}", rows, dim, "sum", (f"f_t{i}",), -0.01, 0.01, sparse_optimizer, here))
        features.append(SparseFeature(f"f_t{i}", f"t{i}", ids, True, False, False, here))
    sgd = Optimizer("sgd", 0.01)
    return ModelIR(
        version=1,
        name="planner_bench",
        source="planner_bench",
        source_sha256="",
        dense=(),
        sparse=tuple(features),
        tables=tuple(tables),
        blocks=(),
        heads=(),
        training=Training(BATCH_PER_RANK * world_size, 0, 1, sgd, sparse_optimizer, here),
        sharding=Sharding(world_size, "cuda", RANKS_PER_HOST, None, (), here),
        data=None,
        loc=here,
    )


def run_one(num_tables: int, world_size: int, memory_per_rank: int | None) -> dict:
    ir = bench_ir(num_tables, world_size)
    topology = topology_from_ir(ir, memory_per_rank=memory_per_rank)
    line: dict = {
        "tables": num_tables,
        "ranks": world_size,
        "memory_per_rank": format_bytes(topology.memory_per_rank),
    }
    start = time.perf_counter()
    try:
        result = plan(ir, topology)
    except CompileError as error:
        line["seconds"] = round(time.perf_counter() - start, 3)
        line["infeasible"] = error.diagnostics[0].message
        return line
    line["seconds"] = round(time.perf_counter() - start, 3)
    loads = [r.cost_ms for r in result.ranks]
    slowest = max(loads)
    line["imbalance"] = round(slowest / (sum(loads) / len(loads)), 4)
    line["gap"] = round(slowest / result.lower_bound_ms, 4)
    line["slowest_ms"] = round(slowest, 3)
    line["lower_bound_ms"] = round(result.lower_bound_ms, 3)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--roomy-memory", type=parse_bytes, default=parse_bytes("1TiB"))
    args = parser.parse_args()
    for world_size in args.ranks:
        for memory in (None, args.roomy_memory):
            print(json.dumps(run_one(args.tables, world_size, memory)), flush=True)


if __name__ == "__main__":
    main()
