"""retrieval-bench: two-tower training throughput, and retrieve latency from an index vs exact search.

Training (`--mode local|dist2`) compiles specs/bench/retrieval_bench.yaml (the
workload of benchmarks/retrieval_workload.py: a query and an item tower over
1,048,576 x 64 tables, a softmax over the global batch's 1,024 in-batch
candidates) through the normal compiler path and trains it on the workload's
reference batches, the ones the TorchRec anchor
(benchmarks/torchrec_retrieval_anchor.py) sees; one JSON line per run, the
schema of ../shared/bench/WORKLOAD.md with "variant": "retrieval", plus the
CPU fields of dlrm_bench.py (`cpu`, `cpu_flags`, `kernels`, ...) and
`sgemm_gflops`: the in-batch softmax's three products (1,024 x 64 x 1,024)
timed alone with torch.mm right after the run, at its threads
(gemm_floor.py). Its step is about 70% matrix products run near this CPU's
peak (at one thread the softmax's native pass does 85 GFLOP/s where torch.mm
does 96), so it moves with what the host lets two threads do: in one quiet
sitting dlrm-bench's 2-thread rate read 100 to 172 GFLOP/s from run to run.

Retrieve (`--mode retrieve`): the spec's inference module (what `reccompile
export` writes, fp32 tables, the freshly initialised weights) and its item
tower on the first `--items` rows of the item table, an index of each `--index` kind over them
(runtime.retrieval.index: exact is torch's matrix product, flat/ivf/hnsw are
faiss's), then per batch size (1 and 512) the latency of one request batch:
the query tower on the users, then the index's top `--k`. One JSON line per
(index, batch): p50/p99 ms over `--repeats` timed batches, queries/s, the
index's build seconds and its top-k overlap with exact search.

    python benchmarks/retrieval_bench.py --mode local
    python benchmarks/retrieval_bench.py --mode dist2
    python benchmarks/retrieval_bench.py --mode retrieve --index exact,flat,ivf,hnsw
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's runtime and compiler
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemm_floor
import harness  # noqa: E402
import retrieval_workload as workload  # noqa: E402

SPEC = harness.REPO / "specs" / "bench" / "retrieval_bench.yaml"
BATCHES = (1, 512)
_B, _D = workload.GLOBAL_BATCH, workload.EMBEDDING_DIM
# The in-batch softmax's products: logits q c^T, then softmax @ c and q^T @ softmax (d/dq, d/dc)
SOFTMAX_PRODUCTS = Counter(
    {
        ((_B, _D), (_D, _B), torch.float32): 1,
        ((_B, _B), (_B, _D), torch.float32): 1,
        ((_D, _B), (_B, _B), torch.float32): 1,
    }
)


def compile_module(world_size: int, outdir: str) -> Path:
    return harness.compile_spec(SPEC, world_size, outdir)


def request_batch(module: ModuleType, users: np.ndarray, items: np.ndarray) -> Any:
    """A Batch of the spec's two features; no labels: the positives are the item ids."""
    from runtime.data.batch import Batch
    from runtime.sparse.jagged import KeyedJaggedTensor

    keys = [feature.name for feature in module.INPUTS.sparse]
    if keys != ["user_id", "item_id"]:
        raise SystemExit(f"error: {SPEC.name} has sparse features {keys}; the workload feeds user_id, item_id")
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.from_numpy(np.concatenate([users, items])),
        lengths=torch.ones(users.shape[0] + items.shape[0], dtype=torch.long),
    )
    return Batch(dense={}, sparse=sparse, labels={})


def make_batches(module: ModuleType, rank: int) -> list[Any]:
    """This rank's half (dist2) or the whole (local) of each global batch of the workload."""
    import torch.distributed as dist

    world_size = dist.get_world_size() if dist.is_initialized() else 1
    return [
        request_batch(module, *workload.make_batch(index, rank, world_size)) for index in range(workload.NUM_BATCHES)
    ]


def retrieval_workload(world_size: int) -> harness.Workload:
    return harness.Workload(
        variant="retrieval",
        batch_size=workload.GLOBAL_BATCH // world_size,
        model_seed=workload.MODEL_SEED,
        compile=compile_module,
        batches=make_batches,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_run_arguments(parser, modes=("local", "dist2", "retrieve"))
    parser.add_argument(
        "--index",
        default="exact,flat,ivf,hnsw",
        help="retrieve: index kinds, comma-separated (faiss kinds skipped without faiss)",
    )
    parser.add_argument("--items", type=int, default=1 << 17, help="retrieve: items in the index (131,072)")
    parser.add_argument("--k", type=int, default=100, help="retrieve: results per request (100)")
    parser.add_argument("--repeats", type=int, default=50, help="retrieve: timed request batches per size (50)")
    return parser.parse_args(argv)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def serving_model(outdir: str) -> tuple[ModuleType, torch.nn.Module]:
    """The spec's inference module (as `reccompile export` writes it, fp32) with the freshly
    initialised training model's weights: the query tower `reccompile retrieve` runs."""
    from compiler.serving.emit import emit_inference
    from compiler.serving.export import load_trained_state, resolve_precisions, table_weights
    from compiler.serving.lower import lower_inference
    from compiler.spec.load import load
    from compiler.spec.validate import validate
    from runtime.serving.export_dir import import_module
    from runtime.train.worker import load_module

    torch.manual_seed(workload.MODEL_SEED)
    state = load_module(str(compile_module(1, outdir))).build().full_state_dict()
    ir = validate(load(str(SPEC)))
    path = Path(outdir) / "serving.py"
    path.write_text(emit_inference(lower_inference(ir), resolve_precisions(ir, "none", {})))
    module = import_module(path)
    model = module.Model()
    load_trained_state(model, state, table_weights(ir, state, SPEC), SPEC)
    return module, model


def retrieve_lines(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Latency of query tower + top-k per index kind and batch size (see the module docstring)."""
    from runtime.retrieval.index import FAISS_KINDS, build_index, faiss_available
    from runtime.retrieval.index_quality import top_k_overlap

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as outdir, torch.inference_mode():
        module, model = serving_model(outdir)
        ids = torch.arange(args.items)
        items = torch.cat([model.item_vectors(chunk) for chunk in ids.split(1 << 16)])
        kinds = [kind for kind in args.index.split(",") if kind not in FAISS_KINDS or faiss_available()]
        users, _ = workload.make_batch(0)
        requests = {size: request_batch(module, users[:size], np.zeros(size, dtype=np.int64)) for size in BATCHES}
        exact = build_index(items, ids, kind="exact")
        _, truth = exact.search(model.query_vectors(requests[512].dense, requests[512].sparse), args.k)
        lines = []
        for kind in kinds:
            started = time.perf_counter()
            index = exact if kind == "exact" else build_index(items, ids, kind=kind)
            build_s = time.perf_counter() - started
            for size, batch in requests.items():
                times, found = [], truth
                for repeat in range(3 + args.repeats):  # 3 untimed
                    started = time.perf_counter()
                    found = index.search(model.query_vectors(batch.dense, batch.sparse), args.k)[1]
                    if repeat >= 3:
                        times.append(time.perf_counter() - started)
                lines.append(
                    {
                        "impl": "reccompile",
                        "variant": "retrieve",
                        "index": kind,
                        "params": dict(index.params),
                        "batch": size,
                        "items": args.items,
                        "k": args.k,
                        "repeats": args.repeats,
                        "p50_ms": round(percentile(times, 0.5) * 1e3, 3),
                        "p99_ms": round(percentile(times, 0.99) * 1e3, 3),
                        "queries_per_s": round(size / statistics.median(times), 1),
                        "build_s": round(build_s, 3),
                        "threads": torch.get_num_threads(),
                        "top_k_overlap": round(top_k_overlap(found, truth[:size]), 4),
                        "load_avg_1m": round(os.getloadavg()[0], 2),
                    }
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.bench_cache()
    from runtime.cpu import choice

    if args.mode == "retrieve":
        if args.threads is None:
            from runtime.cpu.threads import choose_threads

            args.threads = choose_threads(1, 0).threads
        for _ in range(args.repeat):
            for line in retrieve_lines(args):
                print(json.dumps({**line, **choice.machine()}), flush=True)
        return 0
    harness.settle_defaults(args)
    if args.steps is None:
        args.steps = workload.DEFAULT_STEPS
    bench = retrieval_workload(2 if args.mode == "dist2" else 1)
    for _ in range(args.repeat):
        for summary in harness.run(args, bench):
            torch.set_num_threads(summary["threads_per_proc"])  # the rate of the run's threads, just after it
            rate = gemm_floor.floor(SOFTMAX_PRODUCTS)["sgemm_gflops"]
            # the summary keeps its ranks' kernels
            print(json.dumps({**choice.machine(), **summary, "sgemm_gflops": rate}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
