"""benchmarks/ab.sh: each workload runs our script and its TorchRec anchor in alternating order, and the
summary gives each pair's ratio and their median."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "ab.sh"

# Stands in for both interpreters: logs which side ran with which arguments and prints a result line,
# ours at 3000 samples/s and 50 CPU ms a step, TorchRec's at 1000 + 100 * its run, 120 CPU ms.
FAKE = """#!/usr/bin/env bash
count=$(( $(cat "$COUNTER" 2>/dev/null || echo 0) + 1 )); echo "$count" > "$COUNTER"
echo "$SIDE $*" >> "$LOG"
if [[ $SIDE == ours ]]; then
    echo '{"samples_per_s": 3000.0, "cpu_ms_per_step": 50.0, "threads_per_proc": 2, "sgemm_gflops": 150.0}'
else
    theirs=$(( $(cat "$THEIRS" 2>/dev/null || echo 0) + 1 )); echo "$theirs" > "$THEIRS"
    echo "{\\"samples_per_s\\": $(( 1000 + 100 * theirs )).0, \\"cpu_ms_per_step\\": 120.0}"
fi
"""


def _run(tmp_path: Path, *args: str, their_opts: str = "") -> subprocess.CompletedProcess[str]:
    for side in ("ours", "torchrec"):
        fake = tmp_path / side
        fake.write_text(FAKE.replace("$SIDE", side))
        fake.chmod(0o755)
    env = {
        **os.environ,
        "OURS_PY": str(tmp_path / "ours"),
        "TORCHREC_PY": str(tmp_path / "torchrec"),
        "RECCOMPILE_BENCH_WORKLOADS": "/shared",
        "THEIR_OPTS": their_opts,
        "COUNTER": str(tmp_path / "count"),
        "THEIRS": str(tmp_path / "theirs"),
        "LOG": str(tmp_path / "log"),
    }
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_pairs_alternate_and_the_summary_gives_each_ratio_and_the_median(tmp_path: Path) -> None:
    done = _run(tmp_path, "criteo", "dist2", "3", "--steps", "4", their_opts="--pipeline")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log").read_text().splitlines() == [
        "ours benchmarks/dlrm_bench.py --variant criteo --mode dist2 --steps 4",
        "torchrec /shared/torchrec_bench.py --variant criteo --mode dist2 --pipeline --steps 4",
        "torchrec /shared/torchrec_bench.py --variant criteo --mode dist2 --pipeline --steps 4",
        "ours benchmarks/dlrm_bench.py --variant criteo --mode dist2 --steps 4",
        "ours benchmarks/dlrm_bench.py --variant criteo --mode dist2 --steps 4",
        "torchrec /shared/torchrec_bench.py --variant criteo --mode dist2 --pipeline --steps 4",
    ]
    lines = [re.sub(r"\(load [0-9.]+\)", "(load)", line) for line in done.stdout.splitlines()]
    tail = "step ms median (p10-p90) ours ?, torchrec ?; sgemm 150.0 GFLOP/s"
    assert lines[:3] == [
        "round 1 criteo dist2 (ours first): ours 3000.0 samples/s, 50.0 CPU ms/step, 2 threads (load), "
        f"torchrec 1100.0, 120.0 (load): 2.727, CPU 2.4; {tail}",
        "round 2 criteo dist2 (torchrec first): ours 3000.0 samples/s, 50.0 CPU ms/step, 2 threads (load), "
        f"torchrec 1200.0, 120.0 (load): 2.5, CPU 2.4; {tail}",
        "round 3 criteo dist2 (ours first): ours 3000.0 samples/s, 50.0 CPU ms/step, 2 threads (load), "
        f"torchrec 1300.0, 120.0 (load): 2.308, CPU 2.4; {tail}",
    ]
    assert lines[3:] == [
        "median criteo dist2 ours/torchrec 2.500 over 3 pairs: [2.727, 2.5, 2.308]",
        "median criteo dist2 CPU per step torchrec/ours 2.400 over 3 pairs: [2.4, 2.4, 2.4]",
    ]


def test_each_workload_runs_its_own_pair_of_scripts(tmp_path: Path) -> None:
    for workload, ours, theirs in (
        ("retrieval", "benchmarks/retrieval_bench.py", "benchmarks/torchrec_retrieval_anchor.py"),
        ("gen", "benchmarks/gen_bench.py", "/shared/torchrec_gen_bench.py"),
        ("seq", "benchmarks/seq_bench.py", "/shared/torchrec_seq_bench.py"),
        ("multihot", "benchmarks/dlrm_bench.py --variant multihot", "/shared/torchrec_bench.py --variant multihot"),
    ):
        (tmp_path / "log").unlink(missing_ok=True)
        done = _run(tmp_path, workload, "local", "1")
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "log").read_text().splitlines() == [
            f"ours {ours} --mode local",
            f"torchrec {theirs} --mode local",
        ]


def test_an_unknown_workload_is_named_and_nothing_runs(tmp_path: Path) -> None:
    done = _run(tmp_path, "dlrm", "local", "1")
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "error: ab.sh: unknown WORKLOAD 'dlrm' (criteo, multihot, retrieval, gen or seq)",
    )
    assert not (tmp_path / "log").exists()
