"""Zeroed CPU buffers on transparent huge pages, for tables read at random rows.

A pooled lookup reads rows scattered over hundreds of megabytes (dlrm-bench:
26 tables of 100,000 rows, 94-666 MB by precision), so on 4 KiB pages
nearly every row costs a TLB miss and a page walk, a two-level walk under a
hypervisor. On 2 MiB pages the page tables of such a buffer fit the TLB.
Linux gives anonymous memory huge pages where `madvise(MADV_HUGEPAGE)`
asks for them (transparent_hugepage `madvise` or `always`); the pages are
allocated as the buffer is first written. Measured on the 2-core AVX2 EPYC
(KVM guest), runtime/cpu/native's pooling of 266,240 int8 rows: 3.82 ms on
4 KiB pages, 3.54 ms on huge pages (fbgemm's kernel: 7.36 and 6.79 ms).

Where the kernel has no transparent huge pages (or the platform no
`MADV_HUGEPAGE`), the buffer is ordinary zeroed memory.
"""

from __future__ import annotations

import mmap

import torch

__all__ = ["HUGE_PAGE_BYTES", "MIN_BYTES", "zeros"]

HUGE_PAGE_BYTES = 2 << 20
MIN_BYTES = 8 << 20  # smaller buffers: the 4 KiB pages of their rows fit the TLB anyway


def zeros(nbytes: int) -> torch.Tensor:
    """`nbytes` zeroed bytes (uint8, CPU), aligned to and backed by huge pages where Linux offers them."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < MIN_BYTES or advice is None:
        return torch.zeros(nbytes, dtype=torch.uint8)
    # Private and anonymous (Python's default, shared, would be shmem, which THP `madvise` skips);
    # one huge page more than asked, to start the tensor on a huge-page boundary.
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(advice)
    except OSError:  # a kernel built without transparent huge pages: ordinary pages
        pass
    whole = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive
    start = -whole.data_ptr() % HUGE_PAGE_BYTES
    return whole[start : start + nbytes]
