"""benchmarks/dlrm_bench.py still runs against the generated module (two steps, no timing claims)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_env import WORKLOADS, bench_env

from runtime.cpu import choice

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (WORKLOADS / "workload.py").is_file(), reason=f"no shared bench workload in {WORKLOADS}")
@pytest.mark.parametrize("mode", ["local", "dist2"])
def test_dlrm_bench_runs_and_reports_its_fields(tmp_path: Path, mode: str) -> None:
    stale = choice.directory(tmp_path) / "lookup" / "b1_from_another_run.json"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"kernel": "lookup", "shape": stale.stem, "winner": "concurrent", "times_ms": {}}))
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "dlrm_bench.py"),
            "--variant",
            "criteo",
            "--mode",
            mode,
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
    assert (line["impl"], line["variant"], line["mode"], line["steps"]) == ("reccompile", "criteo", mode, 2)
    assert line["samples_per_s"] > 0 and abs(line["loss_first"] - 0.6931) < 0.01
    assert {"cpu", "cpu_flags", "kernels"} <= line.keys()
    assert line["cpu_ms_per_step"] > 0
    # criteo's dense products: 13-512-256-64 and 415-512-256-1 over 2,048 samples (forward, both gradients but
    # the first layer's input's) and the 27 x 27 Gram matrix of the dot interaction (forward, and its
    # gradient in one product: (g + g^T) z, runtime/modules/blocks/pooled.py)
    mlp = 2 * 2048 * (3 * (13 * 512 + 512 * 256 + 256 * 64 + 415 * 512 + 512 * 256 + 256) - 13 * 512)
    assert line["dense_gflop"] == round((mlp + 2 * 2 * 2048 * 27 * 64 * 27) / 1e9, 4)
    assert line["gemm_floor_ms"] > 0 and line["sgemm_gflops"] > 0
    assert line["step_over_floor"] == round(line["step_ms_median"] / line["gemm_floor_ms"], 2)
    # The kernels the ranks ran (every one recorded in the cache, less the stale choice it already held).
    recorded: dict[str, dict[str, str]] = {}
    for made in choice.directory(tmp_path).glob("*/*.json"):
        recorded.setdefault(made.parent.name, {})[made.stem] = json.loads(made.read_text())["winner"]
    del recorded["lookup"][stale.stem]
    assert line["kernels"] == {kernel: by_shape for kernel, by_shape in recorded.items() if by_shape}
    assert "linear" in line["kernels"]
