"""inference-bench: dlrm-bench prediction latency and quality per table precision, against TorchRec.

A configuration is the tables' precision, optionally with `/bf16`: the dense
blocks in bfloat16 (`reccompile export --dense bf16`). TorchRec's quantized
model keeps its dense part in fp32, so `int8` is the like-for-like
comparison and `int8/bf16` a different trade (its AUC/NE cost is reported),
as is `int8/int8` (`--dense int8`: MLP blocks on int8 layers where measured
faster). With --blocks, TorchRec's side of `int8/int8` quantizes its MLPs to
int8 too (torch's dynamic int8 Linear, torchrec_infer_server.py --dense int8),
like for like; in rounds, the anchor script keeps them fp32.

The workload of ../shared/bench/INFERENCE.md, through the real serving path:

1. prepare (cached in --workdir): compile specs/bench/dlrm_bench_criteo.yaml
   at world size 1, train it on synthetic batches with a learnable signal
   (runtime.data.synthetic.batches) for --train-steps steps, save a checkpoint
   (runtime.checkpoint.store), and `reccompile export` it in every configuration.
2. sizes: each export's manifest, bytes on disk per table and in all.
3. quality: every export scores the same held-out synthetic batches (same
   hidden model, steps the training never saw); AUC and NE per precision and
   the change from fp32; max |logit - fp32 logit| on the workload's reference
   batch (as TorchRec's script reports it).
4. latency, in rounds; in each round every configuration is a pair of runs
   side by side, ours and TorchRec's at its precision, in alternating order
   (ours first for the first configuration of round 0, then TorchRec first,
   ...), so that the two runs of a pair are seconds apart. Each run is a
   fresh process with --threads threads and the protocol of
   ../shared/bench/torchrec_infer_bench.py: the workload's inputs, the
   KeyedJaggedTensor built inside the timed call, 20 warm-up calls, 200 timed
   calls (50 at batch 512), p50/p99 of the per-call times, samples/s = B *
   calls / total time. Medians over rounds, the ratio of the medians' samples/s
   (ours over TorchRec's), and the median of the pairs' own ratios.

   Each run's lines also carry `host_gemm_gflops`: a float32 GEMM of the top
   MLP's first layer (512 x 415 x 512, --threads threads) timed for 0.1 s just
   before the run. The host can slow this 2-core guest by a third with no
   steal time to show for it (another guest on the same physical cores); the
   GEMMs are most of both sides' forward and slow alike, so the ratio falls
   toward 1 in such minutes, and this field shows when that happened.

   With --blocks N, each case is instead timed in N blocks of calls that
   alternate between two live processes, ours and TorchRec's, a fraction of a
   second apart (see `interleave`): the median of the blocks' paired ratios
   holds where the host's speed drifts between the rounds' fresh processes.

    python benchmarks/inference_bench.py                         # everything; TorchRec from /tmp/venv-torchrec
    python benchmarks/inference_bench.py --rounds 5 --skip-torchrec
    python benchmarks/inference_bench.py --configs int8 --blocks 30

One JSON line per measurement, then a summary table and a last JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
BENCH = harness.workload_dir()  # $RECCOMPILE_BENCH_WORKLOADS, else ../shared/bench
SPEC = "specs/bench/dlrm_bench_criteo.yaml"
PRECISIONS = ("fp32", "fp16", "int8", "int4")
CONFIGS = PRECISIONS + tuple(f"{p}/bf16" for p in PRECISIONS) + ("int8/int8",)
QUANTIZE = {"fp32": "none", "fp16": "fp16", "int8": "int8", "int4": "int4"}
CASES = (("criteo", 1, 200), ("criteo", 64, 200), ("criteo", 512, 50), ("multihot", 512, 50))
WARMUP = 20
HELD_OUT_STEP = 1_000_000  # held-out batches: steps the training never draws
TORCHREC_PYTHON = "/tmp/venv-torchrec/bin/python"
PAUSE, UNTIMED = 0.05, 2  # before each block of --blocks: seconds of rest, then untimed calls (see interleave)


def parts(config: str) -> tuple[str, str]:
    """(table precision, dense dtype) of a configuration."""
    precision, _, dense = config.partition("/")
    return precision, dense or "fp32"


def export_dir(workdir: Path, config: str) -> Path:
    return workdir / ("export_" + config.replace("/", "_"))


def workload() -> Any:
    return harness.load_reference("workload")


# -- 1. prepare ------------------------------------------------------------------------


def prepare(workdir: Path, train_steps: int) -> None:
    """Train, checkpoint and export once; later runs reuse the work directory."""
    from compiler.cli import main as reccompile
    from compiler.pipeline import Options, generate
    from runtime.checkpoint.store import latest_checkpoint, save_checkpoint
    from runtime.train.dense_optimizer import make_dense_optimizer
    from runtime.train.loop import train_step
    from runtime.train.worker import load_module

    checkpoints = workdir / "checkpoint"
    if latest_checkpoint(checkpoints) is None:
        module = load_module(str(generate(SPEC, Options(world_size=1)).write(workdir / "build")[0]))
        torch.manual_seed(workload().MODEL_SEED)
        model = module.build()
        optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
        started = time.perf_counter()
        for step in range(train_steps):
            loss = train_step(model, optimizer, module.synthetic_batch(step=step))
        seconds = time.perf_counter() - started
        emit({"prepare": "trained", "steps": train_steps, "loss_last": float(loss), "seconds": round(seconds, 1)})
        save_checkpoint(
            checkpoints, model, optimizer, step=train_steps, spec_sha256=module.SPEC_SHA256, plan=module.PLAN
        )
        del model, optimizer
    for config in CONFIGS:
        out, (precision, dense) = export_dir(workdir, config), parts(config)
        if not (out / "manifest.json").is_file():
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON lines only
                code = reccompile(
                    [
                        "export",
                        SPEC,
                        "--checkpoint",
                        str(checkpoints),
                        "--quantize",
                        QUANTIZE[precision],
                        "--dense",
                        dense,
                        "--no-aot",
                        "-o",
                        str(out),
                    ]
                )
            if code != 0:
                raise SystemExit(f"error: reccompile export failed for {config}")


# -- 2. sizes and 3. quality -------------------------------------------------------------


def sizes(workdir: Path) -> dict[str, dict[str, Any]]:
    rows = {}
    for precision in PRECISIONS:
        manifest = json.loads((export_dir(workdir, precision) / "manifest.json").read_text())
        table = manifest["tables"][0]
        rows[precision] = {
            "table_bytes": table["bytes"],
            "row_bytes": table["row_bytes"],
            "tables_bytes": manifest["tables_bytes"],
            "vs_fp32": round(manifest["tables_fp32_bytes"] / manifest["tables_bytes"], 2),
        }
    return rows


def quality(workdir: Path, eval_batches: int) -> dict[str, dict[str, Any]]:
    from runtime.data.synthetic.batches import make_batch
    from runtime.reporting.metrics import auc, normalized_entropy
    from runtime.serving.export_dir import load
    from runtime.sparse.jagged import KeyedJaggedTensor

    W = workload()
    dense, ids, _ = W.make_batch(0, "multihot", batch_size=512)
    reference = (
        {"int": torch.from_numpy(dense)},
        KeyedJaggedTensor(W.FEATURE_NAMES, torch.from_numpy(ids.reshape(-1)), lengths=torch.full((26 * 512,), 20)),
    )
    results: dict[str, dict[str, Any]] = {}
    base_logits = None
    for config in CONFIGS:
        module, model = load(export_dir(workdir, config), verify=False)
        inputs = module.INPUTS
        logits, labels = [], []
        with torch.inference_mode():
            for k in range(eval_batches):
                batch = make_batch(inputs, inputs.training.batch_size, HELD_OUT_STEP + k, inputs.training.seed)
                logits.append(model(batch.dense, batch.sparse)["click"])
                labels.append(batch.labels["click"])
            probe = model(*reference)["click"]
        logit, label = torch.cat(logits).double(), torch.cat(labels).double()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, label, reduction="sum")
        results[config] = {
            "auc": auc(torch.sigmoid(logit), label),
            "ne": normalized_entropy(float(loss), float(label.sum()), label.numel()),
            "max_abs_logit_diff_vs_fp32": 0.0 if base_logits is None else float((probe - base_logits).abs().max()),
        }
        base_logits = probe if base_logits is None else base_logits
        del model
    for row in results.values():
        row["auc_change"] = row["auc"] - results["fp32"]["auc"]
        row["ne_change"] = row["ne"] - results["fp32"]["ne"]
    return results


# -- 4. latency ---------------------------------------------------------------------------


def cpu_counters() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6], sum(fields[:8])


def workload_inputs(variant: str, batch: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The workload's first batches of `variant` at `batch` as (dense, ids, lengths), cycled by the timed calls."""
    W = workload()
    lengths = torch.full((W.NUM_SPARSE_FEATURES * batch,), W.VARIANTS[variant], dtype=torch.int64)
    return [
        (torch.from_numpy(d), torch.from_numpy(i.reshape(-1)), lengths)
        for d, i, _ in (W.make_batch(n, variant, batch_size=batch) for n in range(W.NUM_BATCHES))
    ]


def exported_forward(workdir: Path, config: str) -> Callable[[tuple[torch.Tensor, ...], int], Any]:
    """The export of `config` as a call on one input of workload_inputs, the KeyedJaggedTensor built inside it."""
    from runtime.serving.export_dir import load
    from runtime.sparse.jagged import KeyedJaggedTensor

    names = workload().FEATURE_NAMES
    _, model = load(export_dir(workdir, config), verify=False)

    def forward(item: tuple[torch.Tensor, ...], batch: int) -> Any:
        dense, values, lengths = item
        return model({"int": dense}, KeyedJaggedTensor(names, values, lengths=lengths, stride=batch))

    return forward


def measure(workdir: Path, configs: list[str]) -> None:
    """Our side of one round (run in a fresh process): one JSON line per configuration and case."""
    from runtime.cpu import choice
    from runtime.cpu.allocator import frozen_objects, retain_freed_memory

    retain_freed_memory()  # as `reccompile predict` does
    inputs = {(variant, batch): workload_inputs(variant, batch) for variant, batch, _ in CASES}
    for config in configs:
        choice.forget_used()  # each configuration's line names its own kernels
        forward = exported_forward(workdir, config)
        for variant, batch, calls in CASES:
            items = inputs[variant, batch]
            times = []
            with frozen_objects(), torch.inference_mode():  # as `reccompile predict` does
                for n in range(WARMUP):
                    forward(items[n % len(items)], batch)
                for n in range(calls):
                    started = time.perf_counter_ns()
                    forward(items[n % len(items)], batch)
                    times.append(time.perf_counter_ns() - started)
            ms = np.array(times, dtype=np.float64) / 1e6
            emit(
                {
                    "config": config,
                    "precision": parts(config)[0],
                    "variant": variant,
                    "batch": batch,
                    "calls": calls,
                    "p50_ms": round(float(np.percentile(ms, 50)), 4),
                    "p99_ms": round(float(np.percentile(ms, 99)), 4),
                    "samples_per_s": round(batch * calls / (ms.sum() / 1e3), 1),
                }
            )
        del forward
        gc.collect()  # the previous export's tables go now, not in a later timed call (TorchRec's side does this too)


def serve(workdir: Path, config: str, variant: str, batch: int) -> None:
    """Our side of the interleaved timing (run in a fresh process): 20 warm-up calls, a
    {"ready": ..., "kernels": ...} line, then for each line "N U" on stdin U untimed and N
    timed calls, the latter's nanoseconds printed as a JSON list; ends at end of input.
    TorchRec's side is torchrec_infer_server.py."""
    from runtime.cpu import choice
    from runtime.cpu.allocator import frozen_objects, retain_freed_memory

    retain_freed_memory()
    items, forward = workload_inputs(variant, batch), exported_forward(workdir, config)
    calls = 0
    with frozen_objects(), torch.inference_mode():
        for _ in range(WARMUP):
            forward(items[calls % len(items)], batch)
            calls += 1
        print(json.dumps({"ready": True, "kernels": choice.machine()["kernels"]}), flush=True)
        for line in sys.stdin:
            timed, untimed = (int(n) for n in line.split())
            times = []
            for n in range(untimed + timed):
                item = items[calls % len(items)]
                started = time.perf_counter_ns()
                forward(item, batch)
                if n >= untimed:
                    times.append(time.perf_counter_ns() - started)
                calls += 1
            print(json.dumps(times), flush=True)


def host_gemm_gflops(seconds: float = 0.1) -> float:
    """GFLOP/s of the median call of a float32 512 x 415 x 512 GEMM over `seconds`, on torch's threads."""
    a, b = torch.randn(512, 415), torch.randn(415, 512)
    torch.mm(a, b)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - started)
    return round(2 * 512 * 415 * 512 / statistics.median(times) / 1e9, 1)


def run_side(command: list[str], impl: str, round_: int, pair: str | None = None) -> list[dict[str, Any]]:
    """One side's process; its JSON lines tagged with impl, round, the configuration it is paired
    with, the host's GEMM speed just before and the CPU others used meanwhile."""
    host = host_gemm_gflops()
    machine_before, children_before = cpu_counters(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    machine_after, children_after = cpu_counters(), resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"error: {impl} run failed:\n{done.stderr[-3000:]}")
    hz = os.sysconf("SC_CLK_TCK")
    own = (children_after.ru_utime - children_before.ru_utime) + (children_after.ru_stime - children_before.ru_stime)
    busy = (machine_after[0] - machine_before[0]) / hz
    total = (machine_after[1] - machine_before[1]) / hz
    other = round(100 * max(busy - own, 0.0) / total, 1) if total else None
    rows = []
    for line in done.stdout.splitlines():
        record = json.loads(line)
        if "variant" in record and "error" not in record:
            # Our lines carry the measuring process's kernels; TorchRec's side runs none of ours.
            rows.append(
                {
                    "impl": impl,
                    "round": round_,
                    "pair": pair,
                    "host_gemm_gflops": host,
                    "other_cpu_pct": other,
                    "kernels": {},
                    **record,
                }
            )
            emit(rows[-1])
    return rows


def interleave_case(args: argparse.Namespace, config: str, variant: str, batch: int, calls: int) -> dict[str, Any]:
    """One case of --blocks: ours (serve) against TorchRec's (torchrec_infer_server.py) at its precision."""
    ours = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve",
        "--workdir",
        str(args.workdir),
        "--threads",
        str(args.threads),
        "--configs",
        config,
        "--variant",
        variant,
        "--batch",
        str(batch),
    ]
    theirs = [
        args.torchrec_python,
        str(REPO / "benchmarks" / "torchrec_infer_server.py"),
        "--precision",
        parts(config)[0],
        "--variant",
        variant,
        "--batch",
        str(batch),
        "--threads",
        str(args.threads),
        "--bench-dir",
        str(BENCH),
        *(["--dense", "int8"] if parts(config)[1] == "int8" else []),
    ]
    host = host_gemm_gflops()
    line = interleave({"reccompile": ours, "torchrec": theirs}, batch, max(calls // 5, 1), args.blocks)
    return {"interleaved": True, "config": config, "variant": variant, "batch": batch, "host_gemm_gflops": host, **line}


def interleave(commands: dict[str, list[str]], batch: int, block: int, blocks: int) -> dict[str, Any]:
    """Two serving processes timed in turns: `blocks` blocks of `block` calls each, side by side.

    Each side builds and warms up once, the second once the first is ready (so
    that ours measures its kernel choices undisturbed), then the two take
    turns: `block` timed calls on one side while the other waits for its next
    request, the first side alternating block by block. A pair of blocks is a fraction of a second
    apart, so a slowdown of the host (seconds to minutes on this 2-core guest)
    meets both sides of most pairs; the median of the pairs' ratios is the
    figure that survives it. Each block starts after a pause of PAUSE seconds,
    so that the last side's OpenMP threads have stopped spinning, with UNTIMED
    calls that wake its own. The first command's side is "ours" in the ratios.
    """
    with contextlib.ExitStack() as stack:
        sides, ready = {}, {}
        for impl, command in commands.items():  # one after the other: our kernel choices measure on a quiet machine
            errors = stack.enter_context(tempfile.TemporaryFile("w+"))
            process = stack.enter_context(
                subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=REPO
                )
            )
            sides[impl] = (process, errors)
            ready[impl] = _answer(impl, process, errors)
        times: dict[str, list[list[int]]] = {impl: [] for impl in sides}
        for n in range(blocks):
            for impl in list(sides) if n % 2 == 0 else reversed(list(sides)):
                process, errors = sides[impl]
                time.sleep(PAUSE)
                process.stdin.write(f"{block} {UNTIMED}\n")
                process.stdin.flush()
                times[impl].append(_answer(impl, process, errors))
        for process, _ in sides.values():
            process.stdin.close()
    ours, theirs = commands
    line: dict[str, Any] = {"blocks": blocks, "block_calls": block, "kernels": ready[ours].get("kernels", {})}
    for impl, timed in times.items():
        ms = np.array([t for b in timed for t in b], dtype=np.float64) / 1e6
        line[f"{impl}_p50_ms"] = round(float(np.percentile(ms, 50)), 4)
        line[f"{impl}_p99_ms"] = round(float(np.percentile(ms, 99)), 4)
        line[f"{impl}_samples_per_s"] = round(batch * ms.size / (ms.sum() / 1e3), 1)
    line["ratio"] = round(line[f"{ours}_samples_per_s"] / line[f"{theirs}_samples_per_s"], 2)
    pairs = [sum(t) / sum(o) for o, t in zip(times[ours], times[theirs])]  # equal calls: a speed ratio
    line["block_ratio_median"] = round(statistics.median(pairs), 2)
    if len(pairs) > 1:
        q1, _, q3 = statistics.quantiles(pairs, n=4)
        line["block_ratio_quartiles"] = [round(q1, 2), round(q3, 2)]
    return line


def _answer(impl: str, process: subprocess.Popen, errors: Any) -> Any:
    """The next JSON line of a serving process, or the end of the benchmark with its error output."""
    answer = process.stdout.readline()
    if not answer:
        process.wait()
        errors.seek(0)
        raise SystemExit(
            f"error: {impl}'s serving process ended (status {process.returncode}):\n{errors.read()[-3000:]}"
        )
    return json.loads(answer)


def interleaved_markdown(lines: list[dict[str, Any]]) -> str:
    table = [
        "| config | variant | batch | ours p50 ms | ours samples/s | TorchRec p50 ms | TorchRec samples/s "
        "| ratio | median block ratio (quartiles) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in lines:
        q1, q3 = r.get("block_ratio_quartiles", [None, None])
        table.append(
            f"| {r['config']} | {r['variant']} | {r['batch']} | {r['reccompile_p50_ms']:.3f} "
            f"| {r['reccompile_samples_per_s']:,.0f} | {r['torchrec_p50_ms']:.3f} | {r['torchrec_samples_per_s']:,.0f} "
            f"| {r['ratio']:.2f} | {r['block_ratio_median']:.2f} ({q1}-{q3}) |"
        )
    return "\n".join(table)


def summarise(rows: list[dict[str, Any]], configs: list[str], max_other_cpu: float) -> list[dict[str, Any]]:
    """Medians over rounds per (configuration, variant, batch), ours beside TorchRec's at its precision.

    Runs during which other processes used more than `max_other_cpu` percent
    of the machine are left out, unless every run of that side was so.
    """
    quiet = [r for r in rows if r["other_cpu_pct"] is not None and r["other_cpu_pct"] <= max_other_cpu]
    used = {impl: quiet if any(r["impl"] == impl for r in quiet) else rows for impl in ("reccompile", "torchrec")}

    def median(impl: str, name: str, variant: str, batch: int, key: str) -> float | None:
        field = "config" if impl == "reccompile" else "precision"
        wanted = (impl, name, variant, batch)
        values = [r[key] for r in used[impl] if (r["impl"], r.get(field), r["variant"], r["batch"]) == wanted]
        return statistics.median(values) if values else None

    table = []
    for config in configs:
        for variant, batch, _ in CASES:
            line: dict[str, Any] = {"config": config, "variant": variant, "batch": batch}
            for impl, name in (("reccompile", config), ("torchrec", parts(config)[0])):
                for key in ("p50_ms", "p99_ms", "samples_per_s"):
                    line[f"{impl}_{key}"] = median(impl, name, variant, batch, key)
                line[f"{impl}_rounds"] = sorted({r["round"] for r in used[impl] if r["impl"] == impl})
            if line["reccompile_samples_per_s"] and line["torchrec_samples_per_s"]:
                line["ratio"] = round(line["reccompile_samples_per_s"] / line["torchrec_samples_per_s"], 2)
            pairs = paired_ratios(rows, config, variant, batch)
            line["paired_ratios"] = pairs
            line["paired_ratio"] = round(statistics.median(pairs), 2) if pairs else None
            table.append(line)
    return table


def paired_ratios(rows: list[dict[str, Any]], config: str, variant: str, batch: int) -> list[float]:
    """Ours over TorchRec's samples/s in each round's pair of runs for `config`, round by round."""

    def run(impl: str, round_: int) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in rows
                if (r["impl"], r["round"], r["pair"], r["variant"], r["batch"])
                == (impl, round_, config, variant, batch)
            ),
            None,
        )

    ratios = []
    for round_ in sorted({r["round"] for r in rows}):
        ours, theirs = run("reccompile", round_), run("torchrec", round_)
        if ours and theirs and theirs["samples_per_s"]:
            ratios.append(round(ours["samples_per_s"] / theirs["samples_per_s"], 2))
    return ratios


def emit(record: dict[str, Any]) -> None:
    """Print `record` with the machine's fields; kernels of its own (a measuring child's) stand."""
    from runtime.cpu import choice

    print(json.dumps({**choice.machine(), **record}), flush=True)


def markdown(table: list[dict[str, Any]], size_rows: dict[str, Any], quality_rows: dict[str, Any]) -> str:
    def number(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        "| config | variant | batch | ours p50 ms | ours p99 ms | ours samples/s | TorchRec p50 ms "
        "| TorchRec p99 ms | TorchRec samples/s | ratio | paired ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        lines.append(
            f"| {row['config']} | {row['variant']} | {row['batch']} | {number(row['reccompile_p50_ms'], '.3f')} "
            f"| {number(row['reccompile_p99_ms'], '.3f')} | {number(row['reccompile_samples_per_s'], ',.0f')} "
            f"| {number(row['torchrec_p50_ms'], '.3f')} | {number(row['torchrec_p99_ms'], '.3f')} "
            f"| {number(row['torchrec_samples_per_s'], ',.0f')} | {number(row.get('ratio'), '.2f')} "
            f"| {number(row.get('paired_ratio'), '.2f')} |"
        )
    lines += ["", "| precision | bytes per table | all 26 tables | vs fp32 |", "|---|---|---|---|"]
    for precision in PRECISIONS:
        s = size_rows[precision]
        lines.append(f"| {precision} | {s['table_bytes']:,} | {s['tables_bytes']:,} | {s['vs_fp32']:.2f}x |")
    lines += [
        "",
        "| config | AUC | NE | AUC change | NE change | max logit diff vs fp32 |",
        "|---|---|---|---|---|---|",
    ]
    for config, q in quality_rows.items():
        lines.append(
            f"| {config} | {number(q['auc'], '.5f')} | {number(q['ne'], '.5f')} | {number(q['auc_change'], '+.1e')} "
            f"| {number(q['ne_change'], '+.1e')} | {number(q['max_abs_logit_diff_vs_fp32'], '.1e')} |"
        )
    return "\n".join(lines)


def bench_cache() -> None:
    """Keeps this benchmark's kernel choices apart from other runs' (each JSON line lists them all)."""
    if "RECCOMPILE_CACHE_DIR" not in os.environ:
        from runtime.cpu.native.build import cache_root

        os.environ["RECCOMPILE_CACHE_DIR"] = str(cache_root() / "bench")


def main(argv: list[str] | None = None) -> int:
    bench_cache()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/reccompile-inference-bench"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="e.g. int8,int8/bf16 (default: all)")
    parser.add_argument("--train-steps", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=10, help="held-out batches of 2048 samples")
    parser.add_argument("--torchrec-python", default=TORCHREC_PYTHON)
    parser.add_argument("--skip-torchrec", action="store_true")
    parser.add_argument(
        "--max-other-cpu",
        type=float,
        default=10.0,
        help="leave out runs during which others used more than this %% of the machine",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=0,
        help="instead of rounds of fresh processes, time each case in this many blocks that "
        "alternate between two live processes, ours and TorchRec's (see interleave)",
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one side of one round
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # one side of --blocks
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r} (choose from {', '.join(CONFIGS)})")
    if args.measure:
        measure(args.workdir, configs)
        return 0
    if args.serve:
        serve(args.workdir, configs[0], args.variant, args.batch)
        return 0
    if args.blocks and args.skip_torchrec:
        parser.error("--blocks times ours against TorchRec's: it cannot go with --skip-torchrec")

    os.chdir(REPO)
    args.workdir.mkdir(parents=True, exist_ok=True)
    prepare(args.workdir, args.train_steps)
    size_rows = sizes(args.workdir)
    emit({"sizes": size_rows})
    cached = args.workdir / "quality.json"  # the exports do not change between runs (configurations may be added)
    if not cached.is_file() or sorted(json.loads(cached.read_text())) != sorted(CONFIGS):
        cached.write_text(json.dumps(quality(args.workdir, args.eval_batches)))
    quality_rows = json.loads(cached.read_text())
    emit({"quality": quality_rows})

    if args.blocks:
        lines = []
        for config in configs:
            for variant, batch, calls in CASES:
                lines.append(interleave_case(args, config, variant, batch, calls))
                emit(lines[-1])
        print(interleaved_markdown(lines), flush=True)
        emit(
            {
                "summary": lines,
                "sizes": size_rows,
                "quality": quality_rows,
                "blocks": args.blocks,
                "threads": args.threads,
            }
        )
        return 0

    rows: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for index, config in enumerate(configs):
            ours = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--measure",
                "--workdir",
                str(args.workdir),
                "--threads",
                str(args.threads),
                "--configs",
                config,
            ]
            theirs = [
                args.torchrec_python,
                str(BENCH / "torchrec_infer_bench.py"),
                "--threads",
                str(args.threads),
                "--precisions",
                parts(config)[0],
            ]
            sides = [("reccompile", ours)] + ([] if args.skip_torchrec else [("torchrec", theirs)])
            for impl, command in sides if (round_ + index) % 2 == 0 else reversed(sides):
                rows += run_side(command, impl, round_, pair=config)
    table = summarise(rows, configs, args.max_other_cpu)
    print(markdown(table, size_rows, quality_rows), flush=True)
    kernels = harness.merged_kernels(
        [r["kernels"] for r in rows if r["impl"] == "reccompile"]
    )  # the measuring children's
    emit(
        {
            "summary": table,
            "sizes": size_rows,
            "quality": quality_rows,
            "rounds": args.rounds,
            "threads": args.threads,
            "kernels": kernels,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
