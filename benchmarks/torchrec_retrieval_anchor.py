#!/usr/bin/env python3
"""TorchRec CPU training-throughput anchor for workload "retrieval-bench" (retrieval_workload.py).

TorchRec's retrieval example shape: one EmbeddingBagCollection (a user and an
item table) under DistributedModelParallel with the planner's default plan,
fused row-wise Adagrad; a query MLP and a candidate MLP (torchrec.modules.mlp);
logits query @ candidates.T over the global batch's candidates (all-gathered
with their gradient in dist2); cross entropy against each sample's own item.

Run it with the TorchRec venv's python (TorchRec is never a dependency of the
project; ../shared/bench/setup_torchrec_venv.sh makes the venv):

    /tmp/venv-torchrec/bin/python benchmarks/torchrec_retrieval_anchor.py --mode local
    /tmp/venv-torchrec/bin/python benchmarks/torchrec_retrieval_anchor.py --mode dist2

Modes as in ../shared/bench: local (1 process, gloo world size 1) and dist2
(2 processes over gloo, 1 intra-op thread each); the global batch is 1,024
in both. The last line printed is one JSON object in the schema of
../shared/bench/WORKLOAD.md with impl "torchrec", variant "retrieval".
"""

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import retrieval_workload as W  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["local", "dist2"], default="local")
    parser.add_argument("--steps", type=int, default=W.DEFAULT_STEPS)
    parser.add_argument("--warmup", type=int, default=W.DEFAULT_WARMUP)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads per process (dist2: 1)")
    parser.add_argument("--port", type=int, default=29541)
    return parser.parse_args(argv)


def machine_jiffies():
    """(busy, total) jiffies of the whole machine from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except OSError:
        return None
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6], sum(fields[:8])


def make_batches(rank, world_size):
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    batches = []
    for index in range(W.NUM_BATCHES):
        user, item = W.make_batch(index, rank, world_size)
        size = user.shape[0]
        batches.append(
            KeyedJaggedTensor(
                keys=["user_id", "item_id"],
                values=torch.from_numpy(__import__("numpy").concatenate([user, item])),
                lengths=torch.ones(2 * size, dtype=torch.int64),
                stride=size,
            )
        )
    return batches


def build_model(world_size):
    import torch
    import torch.distributed.nn.functional as dist_fn
    from torch import nn
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.mlp import MLP

    class TwoTowerSoftmax(nn.Module):
        def __init__(self):
            super().__init__()
            tables = [
                EmbeddingBagConfig(
                    name="user",
                    embedding_dim=W.EMBEDDING_DIM,
                    num_embeddings=W.USER_ROWS,
                    feature_names=["user_id"],
                    pooling=PoolingType.SUM,
                ),
                EmbeddingBagConfig(
                    name="item",
                    embedding_dim=W.EMBEDDING_DIM,
                    num_embeddings=W.ITEM_ROWS,
                    feature_names=["item_id"],
                    pooling=PoolingType.SUM,
                ),
            ]
            self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
            self.query_proj = MLP(in_size=W.EMBEDDING_DIM, layer_sizes=W.TOWER)
            self.candidate_proj = MLP(in_size=W.EMBEDDING_DIM, layer_sizes=W.TOWER)

        def forward(self, kjt):
            pooled = self.ebc(kjt)
            query = self.query_proj(pooled["user_id"])
            candidates = self.candidate_proj(pooled["item_id"])
            first = 0
            if world_size > 1:
                first = torch.distributed.get_rank() * candidates.shape[0]
                candidates = torch.cat(dist_fn.all_gather(candidates), dim=0)  # with its gradient
            logits = query @ candidates.T
            own = torch.arange(first, first + query.shape[0])
            return nn.functional.cross_entropy(logits, own)

    torch.manual_seed(W.MODEL_SEED)
    return TwoTowerSoftmax()


def build_dmp(world_size, group):
    import torch
    import torchrec.optim as trec_optim
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    model = build_model(world_size)
    apply_optimizer_in_backward(
        trec_optim.RowWiseAdagrad, list(model.ebc.parameters()), {"lr": W.EMB_LR, "eps": W.EMB_EPS}
    )
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, local_world_size=world_size, compute_device="cpu"),
        batch_size=W.GLOBAL_BATCH // world_size,
    )
    plan = planner.collective_plan(model, sharders, group)
    model = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=W.DENSE_LR, eps=W.DENSE_EPS),
    )
    return model, CombinedOptimizer([model.fused_optimizer, dense]), plan


def run_training(args, rank, world_size, group):
    import torch
    import torch.distributed as dist

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batches = make_batches(rank, world_size)
    model, optimizer, plan = build_dmp(world_size, group)
    model.train()
    placement = {
        table: f"{shard.sharding_type}/{shard.compute_kernel}@{','.join(map(str, shard.ranks or []))}"
        for _, module_plan in plan.plan.items()
        for table, shard in module_plan.items()
    }

    def step(index):
        optimizer.zero_grad()
        loss = model(batches[index % len(batches)])
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    losses = [step(i) for i in range(args.warmup)]
    dist.barrier(group)
    times = []
    usage_before, machine_before = resource.getrusage(resource.RUSAGE_SELF), machine_jiffies()
    for index in range(args.warmup, args.warmup + args.steps):
        started = time.perf_counter()
        losses.append(step(index))
        times.append(time.perf_counter() - started)
    usage_after, machine_after = resource.getrusage(resource.RUSAGE_SELF), machine_jiffies()
    cpu_s = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    busy = total = None
    if machine_before and machine_after:
        hz = os.sysconf("SC_CLK_TCK")
        busy, total = (machine_after[0] - machine_before[0]) / hz, (machine_after[1] - machine_before[1]) / hz
    return {
        "times": times,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "plan": placement,
        "threads": torch.get_num_threads(),
        "cpu_s": cpu_s,
        "busy_s": busy,
        "total_s": total,
    }


def init_group(rank, world_size, port):
    import importlib

    import torch.distributed as dist

    # Imported after the group exists, this module's functions would capture it as a default argument and
    # keep it (and gloo's threads) alive into the interpreter's exit: a rare SIGABRT at the end of dist2
    # (the cause runtime/train/process_group.py describes; this file runs in TorchRec's venv, without ours).
    importlib.import_module("torch.distributed.nn.functional")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return dist.group.WORLD


def _dist_rank(rank, world_size, args, queue):
    import torch.distributed as dist

    try:
        group = init_group(rank, world_size, args.port)
        result = run_training(args, rank, world_size, group)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, result)
        if rank == 0:
            queue.put(("ok", gathered))
        dist.barrier()
        del group
        gc.collect()  # the model, DMP and autograd graphs hold the group in reference cycles
        dist.destroy_process_group()
    except BaseException:
        import traceback

        queue.put(("error", f"rank {rank}: " + traceback.format_exc()))
        raise


def summarize(args, world_size, results):
    """Step time = the slowest rank's per step; samples/s = global batch / median step."""
    step_s = [max(r["times"][i] for r in results) for i in range(len(results[0]["times"]))]
    median = statistics.median(step_s)
    first = results[0]
    other = None
    if first["busy_s"] is not None and first["total_s"]:
        used = sum(r["cpu_s"] for r in results)
        other = round(max(0.0, 100.0 * (first["busy_s"] - used) / first["total_s"]), 1)
    return {
        "impl": "torchrec",
        "variant": "retrieval",
        "mode": args.mode,
        "samples_per_s": round(W.GLOBAL_BATCH / median, 1),
        "step_ms_median": round(median * 1e3, 3),
        "step_ms_min": round(min(step_s) * 1e3, 3),
        "step_ms_p10_p90": [round(sorted(step_s)[int(q * (len(step_s) - 1))] * 1e3, 3) for q in (0.1, 0.9)],
        "peak_rss_mb": round(sum(r["peak_rss_mb"] for r in results), 1),
        "loss_first": float(f"{first['loss_first']:.6g}"),
        "loss_last": float(f"{first['loss_last']:.6g}"),
        "world_size": world_size,
        "steps": len(step_s),
        "threads_per_proc": first["threads"],
        "other_cpu_pct": other,
        "cpu_ms_per_step": round(1e3 * sum(r["cpu_s"] for r in results) / len(step_s), 2),  # as harness.py
        "plan": first["plan"],
    }


def main(argv=None):
    args = parse_args(argv)
    if args.mode == "dist2":
        import torch.multiprocessing as mp

        world_size = 2
        if args.threads is None:
            args.threads = 1  # two processes on two cores: one busy thread each
        queue = mp.get_context("spawn").SimpleQueue()
        processes = mp.spawn(_dist_rank, args=(world_size, args, queue), nprocs=world_size, join=False)
        status, payload = queue.get()
        if status != "ok":
            print(payload, file=sys.stderr)
            for process in processes.processes:
                if process.is_alive():
                    process.terminate()
            return 1
        processes.join()
        results = payload
    else:
        import torch.distributed as dist

        world_size = 1
        group = init_group(0, 1, args.port)
        results = [run_training(args, 0, 1, group)]
        dist.destroy_process_group()
    print(json.dumps(summarize(args, world_size, results)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
