"""benchmarks/ab_openmp.sh: each setting reaches its runs' environment, and the summary's medians and ratios."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "ab_openmp.sh"

# Stands in for the interpreter: a dlrm_bench.py run prints a result line made from its environment
# (rate = 1000 + GOMP_SPINCOUNT / 10 + 10 * round, the round of two settings from a count of runs kept
# in a file); anything else runs on Python.
FAKE = """#!/usr/bin/env bash
if [[ $1 == benchmarks/dlrm_bench.py ]]; then
    count=$(( $(cat "$COUNTER" 2>/dev/null || echo 0) + 1 )); echo "$count" > "$COUNTER"
    echo "options: ${*:2}" >> "$LOG"
    rate=$(( 1000 + GOMP_SPINCOUNT / 10 + 10 * ((count + 1) / 2) ))
    echo "{\\"samples_per_s\\": $rate.0, \\"cpu_ms_per_step\\": ${OMP_WAIT_POLICY:-50}.5}"
else
    exec "$PYTHON" "$@"
fi
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = {
        **os.environ,
        "OURS_PY": str(fake),
        "PYTHON": sys.executable,
        "COUNTER": str(tmp_path / "count"),
        "LOG": str(tmp_path / "log"),
    }
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_settings_alternate_and_the_summary_gives_medians_and_ratios_against_the_first(tmp_path: Path) -> None:
    done = _run(tmp_path, "2", "GOMP_SPINCOUNT=1000", "GOMP_SPINCOUNT=3000,OMP_WAIT_POLICY=70")
    assert done.returncode == 0, done.stderr
    lines = [line.split(" (load")[0] for line in done.stdout.splitlines()]
    assert lines == [
        "round 1 GOMP_SPINCOUNT=1000: 1110.0 samples/s, 50.5 CPU ms/step",
        "round 1 GOMP_SPINCOUNT=3000,OMP_WAIT_POLICY=70: 1310.0 samples/s, 70.5 CPU ms/step",
        "round 2 GOMP_SPINCOUNT=1000: 1120.0 samples/s, 50.5 CPU ms/step",
        "round 2 GOMP_SPINCOUNT=3000,OMP_WAIT_POLICY=70: 1320.0 samples/s, 70.5 CPU ms/step",
        "GOMP_SPINCOUNT=1000: median 1115.0 samples/s, 50.5 CPU ms/step;"
        " against GOMP_SPINCOUNT=1000: median 1.000 (1.000, 1.000)",
        "GOMP_SPINCOUNT=3000,OMP_WAIT_POLICY=70: median 1315.0 samples/s, 70.5 CPU ms/step;"
        " against GOMP_SPINCOUNT=1000: median 1.179 (1.180, 1.179)",
    ]
    # The default options: dlrm-bench criteo, one process on two threads.
    assert (tmp_path / "log").read_text().splitlines() == ["options: --variant criteo --mode local --threads 2"] * 4


def test_options_after_the_settings_go_to_every_run(tmp_path: Path) -> None:
    done = _run(tmp_path, "1", "GOMP_SPINCOUNT=0", "--", "--variant", "multihot", "--steps", "3")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log").read_text().splitlines() == ["options: --variant multihot --steps 3"]


def test_bad_arguments_name_the_problem(tmp_path: Path) -> None:
    none = _run(tmp_path, "1")
    assert (none.returncode, none.stderr.strip()) == (
        2,
        "error: ab_openmp.sh: name at least one SETTING (e.g. GOMP_SPINCOUNT=1000)",
    )
    bad = _run(tmp_path, "1", "GOMP_SPINCOUNT=1000", "GOMP_SPINCOUNT")
    assert (bad.returncode, bad.stderr.strip()) == (
        2,
        "error: ab_openmp.sh: setting 'GOMP_SPINCOUNT' is not VAR=VALUE[,VAR=VALUE...]",
    )
    assert not (tmp_path / "log").exists()  # nothing ran
