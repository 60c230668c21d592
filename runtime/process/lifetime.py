"""Processes that do not outlive their parent (PR_SET_PDEATHSIG through ctypes, Linux) and that end quickly."""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import select
import signal
import threading
import time

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


def die_with(pid: int) -> None:
    """SIGKILL this process when process `pid`, not its parent, exits; exit now if it is gone.

    For a process started on another's behalf by a third: a data worker's parent is the fork
    server (runtime.process.workers), which outlives the rank for as long as a worker does.
    A daemon thread waits on the process's pidfd (polls once a second where there is none).
    """
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (OSError, AttributeError):  # no pidfd (Linux before 5.3, or elsewhere)
        handle = None

    def watch() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:
            while alive(pid):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name=f"die-with-{pid}", daemon=True).start()


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def skip_exit_collection() -> None:
    """Spare this process's exit the interpreter's last garbage collections.

    With torch loaded they walk every object it made: 0.5 s of each exit, and
    1 s more once torch._dynamo is in, which torch.optim brings (a 2-core
    EPYC). The memory goes back to the system either way. At exit the objects
    alive are frozen (gc.freeze), so the collections pass them by; what must
    still happen does not wait for them: files are closed by their `with`,
    temporary directories by their own atexit hook. Calling it again changes
    nothing.
    """
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
