"""benchmarks/retrieval_bench.py trains the two-tower bench spec and times retrieval (no timing claims)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from bench_env import bench_env

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "retrieval_bench.py"), *args, "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=bench_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.strip().splitlines()]


def test_training_reports_the_workload_fields_and_starts_at_log_1024(tmp_path: Path) -> None:
    (line,) = _run(tmp_path, "--mode", "local", "--steps", "3", "--warmup", "1")
    assert (line["impl"], line["variant"], line["mode"], line["steps"]) == ("reccompile", "retrieval", "local", 3)
    # untrained towers score every candidate alike: the in-batch softmax over 1,024 starts at log(1024)
    assert line["samples_per_s"] > 0 and abs(line["loss_first"] - math.log(1024)) < 0.01
    assert {"cpu", "cpu_flags", "kernels", "peak_rss_mb", "other_cpu_pct"} <= line.keys()
    assert line["cpu_ms_per_step"] > 0
    p10, p90 = line["step_ms_p10_p90"]  # what ab.sh prints: the 10th and 90th of the 3 steps
    assert line["step_ms_min"] <= p10 <= line["step_ms_median"] <= p90
    assert line["sgemm_gflops"] > 0 and line["threads_per_proc"] == 1


def test_retrieve_reports_p50_p99_per_index_and_batch(tmp_path: Path) -> None:
    lines = _run(tmp_path, "--mode", "retrieve", "--index", "exact", "--items", "4096", "--repeats", "3")
    assert [(line["index"], line["batch"]) for line in lines] == [("exact", 1), ("exact", 512)]
    for line in lines:
        assert 0 < line["p50_ms"] <= line["p99_ms"] and line["top_k_overlap"] == 1.0 and line["items"] == 4096
