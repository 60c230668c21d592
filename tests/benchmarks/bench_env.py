"""Where the benchmark tests find the shared bench folder, and the environment they run the scripts in."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# As benchmarks/harness.py finds it: $RECCOMPILE_BENCH_WORKLOADS, else ../shared/bench beside the checkout.
WORKLOADS = Path(os.environ.get("RECCOMPILE_BENCH_WORKLOADS") or REPO.parent / "shared" / "bench")


def bench_env(home: Path) -> dict[str, str]:
    """A bare environment: its own kernel-choice cache and home, and the shared folder named."""
    return {
        "PATH": "/usr/bin:/bin",
        "RECCOMPILE_CACHE_DIR": str(home),
        "HOME": str(home),
        "RECCOMPILE_BENCH_WORKLOADS": str(WORKLOADS),
    }
