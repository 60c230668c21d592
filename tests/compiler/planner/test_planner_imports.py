"""The planner loads no torch: from the runtime it imports only runtime.sharding.types, the
learning-rate schedule's rules (runtime.config.lr_schedule), the reader names
(runtime.data.reader_names) and the feature transforms' configs (runtime.config.transforms),
all plain Python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_planner_imports_only_the_runtimes_sharding_types() -> None:
    code = (
        "import json, sys\n"
        "import compiler.ir, compiler.spec.validate, compiler.planner.planner, compiler.planner.check\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fbgemm_gpu', 'runtime'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        "runtime",
        "runtime.config",
        "runtime.config.lr_schedule",
        "runtime.config.transforms",
        "runtime.data",
        "runtime.data.reader_names",
        "runtime.embeddings",
        "runtime.embeddings.kernels",
        "runtime.sharding",
        "runtime.sharding.types",
    ]
