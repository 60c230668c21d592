"""The planner never promises what the runtime cannot build.

Every (sharding type, compute kernel) pair of runtime.sharding.types, which
the planner enumerates from, is put in one plan by the spec's constraints,
and that plan is compiled and trained on two gloo ranks: each pair builds and
runs in the runtime. A table whose dim the fused kernel cannot hold is left
to the planner, which gives it the dense kernel.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

from runtime.sharding.types import COMPUTE_KERNELS, SHARDING_TYPES

REPO = Path(__file__).resolve().parents[3]
PAIRS = list(itertools.product(SHARDING_TYPES, COMPUTE_KERNELS))


def _spec() -> str:
    sparse = "".join(f"    - {{name: {kind}_{kernel}, num_embeddings: 40, dim: 8}}\n" for kind, kernel in PAIRS)
    constraints = "".join(
        f"    {kind}_{kernel}: {{sharding_types: [{kind}], compute_kernels: [{kernel}]}}\n" for kind, kernel in PAIRS
    )
    return (
        "version: 1\nname: every_pair\nfeatures:\n  dense:\n    - {name: x, size: 3}\n  sparse:\n"
        + sparse
        + "    - {name: odd, num_embeddings: 40, dim: 6}\n"
        + "model:\n  top: {type: mlp, input: [dense.x, sparse.*], layers: [4, 1]}\n"
        + "heads:\n  - {name: click, input: top, loss: bce}\n"
        + "training:\n  batch_size: 16\n"
        + "sharding:\n  world_size: 2\n  ranks_per_host: 1\n  constraints:\n"
        + constraints
    )


def test_every_pair_the_planner_can_emit_builds_and_trains(tmp_path: Path) -> None:
    spec = tmp_path / "every_pair.yaml"
    spec.write_text(_spec())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compiler.cli",
            "train",
            str(spec),
            "--nproc",
            "2",
            "--steps",
            "2",
            "--log-every",
            "1",
            "-o",
            str(tmp_path / "build"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads((tmp_path / "build" / "every_pair.plan.json").read_text())
    chosen = {t["table"]: (t["sharding_type"], t["compute_kernel"]) for t in plan["tables"]}
    assert chosen.pop("odd")[1] == "dense"
    assert chosen == {f"{kind}_{kernel}": (kind, kernel) for kind, kernel in PAIRS}
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["steps"] == 2 and math.isfinite(summary["loss_last"])
