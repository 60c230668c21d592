"""Fixtures shared by the command tests: a machine whose free cores the test decides."""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest
import torch

from runtime.cpu import threads


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[float], None]]:
    """A 2-core machine; call the fixture with its idle CPUs. torch's thread count is put back afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    yield lambda idle: monkeypatch.setattr(threads, "idle_cpus", lambda seconds: idle)
    torch.set_num_threads(before)
