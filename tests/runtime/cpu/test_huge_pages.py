"""Tests for runtime/cpu/huge_pages.py: large tables move onto 2 MiB pages with their contents intact."""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from runtime.cpu import huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


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
