"""Tests for runtime/cpu/huge_pages.py: zeroed buffers, on huge pages where this kernel gives them."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path

import pytest
import torch

from runtime.cpu import huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _anon_huge_kb() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no AnonHugePages line in /proc/self/smaps_rollup")


def test_a_large_buffer_is_zeroed_aligned_and_lives_as_long_as_the_tensor() -> None:
    size = huge_pages.MIN_BYTES + 12345
    buffer = huge_pages.zeros(size)
    gc.collect()
    assert buffer.dtype == torch.uint8 and buffer.shape == (size,) and buffer.is_contiguous()
    assert buffer.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    assert int(buffer.count_nonzero()) == 0
    buffer[-1] = 7
    assert int(buffer.sum()) == 7


def test_a_small_buffer_is_ordinary_memory() -> None:
    assert torch.equal(huge_pages.zeros(100), torch.zeros(100, dtype=torch.uint8))


@pytest.mark.skipif(
    not hasattr(mmap, "MADV_HUGEPAGE") or not THP.is_file() or "[never]" in THP.read_text(),
    reason="this kernel gives no transparent huge pages",
)
def test_the_buffer_is_backed_by_huge_pages_once_written() -> None:
    before = _anon_huge_kb()
    buffer = huge_pages.zeros(16 << 20)
    buffer.fill_(1)
    assert _anon_huge_kb() - before >= 8 << 10  # at least half of it, whatever else the process frees
