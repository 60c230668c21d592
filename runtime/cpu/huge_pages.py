"""Back large, randomly read CPU tensors (embedding tables) with 2 MiB pages.

A training lookup reads one row per id, anywhere in tables of hundreds of
MiB, and its update writes those rows and their optimizer state back. With
4 KiB pages nearly every such row misses the TLB, whose reach is a few MiB,
and pays a page walk that itself misses the caches. Linux backs anonymous
memory with transparent huge pages where madvise asks for them (the
`madvise` setting, common on servers, gives them nowhere else), and turns
memory already written into huge pages when asked with MADV_COLLAPSE (Linux
6.1+). Measured here (AMD EPYC 7002, 1 thread): gathering 2048 rows of 64
floats from each of 26 tables of 100,000 rows takes 3.5 ms on huge pages
against 4.5 ms on 4 KiB pages.

`use_huge_pages` asks for both on the 2 MiB-aligned inside of a tensor's
memory. The collapse copies the memory once: about 1-3 s for dlrm-bench's
665 MiB of tables, paid when the model is built, against ~2 ms a step. Contents are unchanged; where the kernel refuses (older kernels, THP
`never`, no free huge page) nothing changes and the tensor works as before.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
from collections.abc import Callable

import torch

__all__ = ["MIN_BYTES", "PAGE", "use_huge_pages"]

log = logging.getLogger(__name__)

PAGE = 2 << 20
MIN_BYTES = 8 << 20  # below this the rows fit the reach of the TLB's 4 KiB entries
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def use_huge_pages(tensor: torch.Tensor) -> bool:
    """Asks Linux to back `tensor`'s memory with 2 MiB pages; True if it did.

    Only contiguous CPU tensors of at least MIN_BYTES are considered.
    """
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or nbytes < MIN_BYTES:
        return False
    madvise = _madvise()
    if madvise is None:
        return False
    start = -(-tensor.data_ptr() // PAGE) * PAGE
    end = (tensor.data_ptr() + nbytes) // PAGE * PAGE
    for advice in (_MADV_HUGEPAGE, _MADV_COLLAPSE):
        if madvise(start, end - start, advice) != 0:
            log.debug("huge pages for %d MiB: madvise(%d) failed, errno %d", nbytes >> 20, advice, ctypes.get_errno())
            return False
    return True
