"""Tests for runtime/process/lifetime.py's quick exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import gc, tempfile
from runtime.process.lifetime import skip_exit_collection
freeze = gc.freeze
gc.freeze = lambda: print("frozen", flush=True) or freeze()
skip_exit_collection()
skip_exit_collection()
kept = tempfile.TemporaryDirectory()  # never cleaned up by hand: its finalizer must still run at exit
cycle = [kept]
cycle.append(cycle)
print(kept.name, flush=True)
"""


def test_a_quick_exit_registers_once_and_still_removes_a_temporary_directory() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    directory, *frozen = done.stdout.split()
    assert frozen == ["frozen"]
    assert not Path(directory).exists()
