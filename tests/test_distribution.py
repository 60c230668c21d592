"""The top-level names `compiler` and `runtime` are generic: a foreign `runtime` is refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_a_foreign_runtime_package_is_named(tmp_path: Path) -> None:
    foreign = tmp_path / "runtime"
    foreign.mkdir()
    (foreign / "__init__.py").write_text("VERSION = '9.9'\n")
    done = subprocess.run(
        [sys.executable, "-c", "import compiler"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{REPO}"},
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"ImportError: the 'runtime' package found at {foreign / '__init__.py'} is not reccompile's: another "
        "distribution with a top-level 'runtime' package shadows it; uninstall it or install reccompile in a "
        "virtual environment of its own"
    )


def test_our_runtime_is_accepted() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import compiler, runtime; print(runtime.DISTRIBUTION)"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert (done.returncode, done.stdout) == (0, "reccompile\n")
