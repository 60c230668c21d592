"""Keep freed memory in the process, for the next step's tensors of the same sizes.

Every training step allocates and frees the same large CPU buffers: ids
and their all-to-all buffers, pooled rows, activations and their gradients,
1-30 MiB each. By default glibc's malloc maps blocks of that size afresh
(until its adaptive mmap threshold has grown past them) and returns the
freed top of the heap to the kernel once it exceeds 2x that threshold, so a
step pays a page fault, and the kernel zeroes a page, for every 4 KiB it
writes into such memory: about a tenth of a multihot dlrm-bench step on two
ranks here (134 vs 143 ms, medians of A/B runs of benchmarks/dlrm_bench.py).
Setting M_MMAP_THRESHOLD to glibc's maximum and M_TRIM_THRESHOLD to 1 GiB
keeps such blocks in the heap, where the next step finds them mapped. The
cost is resident memory held at its high-water mark, which a training or
serving process reaches every step anyway.

`frozen_objects()` is the same idea for Python's collector, in serving's
request loops: the loaded model and everything imported (about 300,000
objects with torch) are never garbage, yet every full collection walks them
all. In the inference benchmark's loop one took 82 ms, in the middle of a
1.5 ms forward; frozen, a collection walks only what the loop made.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Iterator

__all__ = ["frozen_objects", "retain_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2)
_TRIM_THRESHOLD = 1 << 30


def retain_freed_memory() -> bool:
    """Tune glibc's malloc as the module docstring says; False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # another libc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


@contextlib.contextmanager
def frozen_objects() -> Iterator[None]:
    """The objects alive on entry (after one collection) left out of garbage collection until exit.

    gc.unfreeze() thaws every frozen object, so a caller's own earlier freeze is kept as it was:
    inside it, this only freezes what has come since."""
    caller_froze = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not caller_froze:
            gc.unfreeze()
