"""benchmarks/gen_bench.py trains the compiled gen-bench specs (two steps, no timing claims)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench_env import WORKLOADS, bench_env

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (WORKLOADS / "gen_workload.py").is_file(), reason=f"no shared bench workload in {WORKLOADS}")
@pytest.mark.parametrize("block", ["transformer", "hstu"])
def test_gen_bench_runs_and_reports_its_fields(tmp_path: Path, block: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gen_bench.py"),
            "--mode",
            "local",
            "--block",
            block,
            "--steps",
            "1",
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
    assert (line["impl"], line["variant"], line["mode"], line["block"], line["steps"]) == (
        "reccompile",
        "gen",
        "local",
        block,
        1,
    )
    # batch 0 at the first step: ln N (N = 12,511) plus the spread of random cosines (GENERATIVE.md)
    assert line["samples_per_s"] > 0 and 12.0 < line["loss_first"] < 12.8
    assert line["positions_per_s"] > 40 * line["samples_per_s"]  # about 50 predictions a sequence
    assert {"cpu", "cpu_flags", "kernels", "peak_rss_mb", "other_cpu_pct"} <= line.keys()
