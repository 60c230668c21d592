"""Tests for runtime/cpu/huge_pages.py: new zeroed buffers and existing tables on 2 MiB pages, contents intact."""

from __future__ import annotations

import gc
import mmap
import platform
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
    assert buffer.data_ptr() % huge_pages.PAGE == 0
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


def _collapse_expected() -> bool:
    """MADV_COLLAPSE needs Linux 6.1+ with transparent huge pages not set to `never`."""
    if platform.system() != "Linux" or not THP.exists() or "[never]" in THP.read_text():
        return False
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1)


def _huge_kib_of(tensor: torch.Tensor) -> int:
    """AnonHugePages (KiB) of the mappings that hold `tensor`, from /proc/self/smaps."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low < end and high > start
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1])
    return total


def test_a_large_table_keeps_its_values_on_huge_pages() -> None:
    table = torch.randn(200_000, 64, generator=torch.Generator().manual_seed(0))  # 51 MiB
    before = table.clone()
    moved = huge_pages.use_huge_pages(table)
    assert moved == _collapse_expected()
    assert torch.equal(table, before)
    if moved:
        assert _huge_kib_of(table) >= (table.numel() * 4 - 2 * huge_pages.PAGE) // 1024


def test_small_strided_and_non_cpu_tensors_are_left_alone() -> None:
    assert not huge_pages.use_huge_pages(torch.zeros(1000, 64))  # 250 KiB: under MIN_BYTES
    assert not huge_pages.use_huge_pages(torch.zeros(64, 100_000).t())  # not contiguous
    assert not huge_pages.use_huge_pages(torch.zeros(200_000, 64, device="meta"))
