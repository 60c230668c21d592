"""benchmarks/seq_bench.py trains the compiled seq-bench spec (two steps, no timing claims)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench_env import WORKLOADS, bench_env

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (WORKLOADS / "seq_workload.py").is_file(), reason=f"no shared bench workload in {WORKLOADS}")
def test_seq_bench_runs_and_reports_its_fields(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "seq_bench.py"),
            "--mode",
            "local",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=bench_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (line["impl"], line["variant"], line["mode"], line["steps"]) == ("reccompile", "seq", "local", 2)
    assert line["samples_per_s"] > 0 and abs(line["loss_first"] - 0.6931) < 0.01
    assert {"cpu", "cpu_flags", "kernels", "peak_rss_mb", "other_cpu_pct"} <= line.keys()
