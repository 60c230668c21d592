"""benchmarks/data_bench.py at a tiny size: its lines and the summary the closing note takes its figures from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_env import bench_env
from runtime.data.prepared.parsing import choose_parsing

REPO = Path(__file__).resolve().parents[2]


def test_data_bench_prepares_reads_and_sums_up_in_one_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "data_bench.py"),
            "--rows",
            "2000",
            "--files",
            "2",
            "--prepare-workers",
            "0",
            "default",
            "--ranks",
            "1",
            "2",
            "--batch-size",
            "256",
            "--row-group-rows",
            "64",
            "--train-steps",
            "0",
            "--workdir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=bench_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [line["bench"] for line in lines] == ["prepare", "prepare", "prepared_read", "prepared_read", "data_summary"]
    assert [line["workers"] for line in lines[:2]] == [0, "default"]
    assert lines[0]["parsing"] == "line by line in this process (--workers 0)"
    summary = lines[-1]
    assert summary["prepare_rows_per_s"].keys() == {"0", "default"}
    assert summary["prepare_parsing"]["default"] == choose_parsing(2, None).describe()  # this machine's cores
    # 2,000 rows: 7 global batches of 256 (1,792 rows) each epoch; row groups of 64 divide 256 / 2
    assert summary["rows_decoded_per_rank"] == {"1": [1792], "2": [896, 896]}
    assert summary["decoded_share_of_one_process"] == {"1": 1.0, "2": 0.5}
    assert {"cpu", "cpu_flags"} <= summary.keys() and "step_overhead_pct" not in summary


def test_the_summary_gives_the_steps_medians_and_overhead_in_percent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from data_bench import summary

    step = {
        "median_ms": {"synthetic": 40.0, "prepared": 41.25},
        "slowdown": 0.0312,
        "data_cpu_ms_per_batch": {"training_thread": 0.5, "reading_in_process": 2.0},
    }
    line = summary([], [], step)
    assert line["step_median_ms"] == {"synthetic": 40.0, "prepared": 41.25} and line["step_overhead_pct"] == 3.12
    assert line["data_cpu_ms_per_batch"] == step["data_cpu_ms_per_batch"]
