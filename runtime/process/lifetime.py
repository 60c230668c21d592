"""Processes that do not outlive their parent: PR_SET_PDEATHSIG through ctypes (Linux)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(number: int) -> bool:
    """Ask the kernel to send `number` to this process when its parent exits; False where unsupported."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, number, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits; exit now if the parent is already gone."""
    if set_parent_death_signal(signal.SIGKILL) and os.getppid() == 1:
        os._exit(1)  # orphaned before the request took hold
