"""Serving tests read the kernel choices their blocks record: the machine counts as quiet, whatever its load."""

from __future__ import annotations

import pytest

from runtime.cpu import choice


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "_core_held_since", lambda before: False)
