"""Tests for runtime/cpu/allocator.py: a step's freed large blocks come back without page faults.

Each case runs in a fresh interpreter: mallopt settings are process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import ctypes, json, resource, sys
    from runtime.cpu.allocator import retain_freed_memory
    tuned = retain_freed_memory() if sys.argv[1] == "tuned" else None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    def faults_of_one_step():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(16 << 20) for _ in range(3)]  # a step's buffers: written, then freed
        for block in blocks:
            libc.memset(block, 1, 16 << 20)
        for block in blocks:
            libc.free(block)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    faults_of_one_step()
    print(json.dumps({"tuned": tuned, "faults": min(faults_of_one_step() for _ in range(3))}))
""")


def _run(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_step_of_freed_16_mib_blocks_is_reused_without_page_faults() -> None:
    plain, tuned = _run("plain"), _run("tuned")
    assert tuned["tuned"] is True
    # glibc returns the 48 MiB freed at the heap's top to the kernel: one fault per 4 KiB next time
    assert plain["faults"] >= 3 * 4096 * 0.9
    assert tuned["faults"] < 100


FROZEN = textwrap.dedent("""
    import gc, json, weakref
    import torch  # over 100,000 objects, none of them garbage
    from runtime.cpu.allocator import frozen_objects

    class Node:
        pass

    before = gc.get_freeze_count()
    with frozen_objects():
        frozen = gc.get_freeze_count()
        cycle = Node()
        cycle.me = cycle  # garbage made inside is still collected
        alive = weakref.ref(cycle)
        del cycle
        gc.collect()
        collected = alive() is None
    after = gc.get_freeze_count()
    gc.freeze()  # a caller's own freeze outlives the block
    with frozen_objects():
        pass
    kept = gc.get_freeze_count() > 0
    print(json.dumps({"before": before, "frozen": frozen, "after": after, "collected": collected, "kept": kept}))
""")


def test_frozen_objects_are_left_out_of_collections_until_the_block_ends() -> None:
    done = subprocess.run([sys.executable, "-c", FROZEN], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["before"] == 0 and result["frozen"] > 100_000, result  # torch's objects, frozen
    assert result["after"] == 0 and result["collected"], result
    assert result["kept"], result
