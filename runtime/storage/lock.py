"""One writer per directory: an exclusive POSIX lock on a file in it, held while writing there.

The lock file keeps the holder's pid, so a second job is told who writes
there. The kernel drops the lock when the holder exits, however it exits,
so a killed job never leaves a stale lock behind. A POSIX (`lockf`) lock
belongs to the process, not to the open file: processes the holder forks
(DataLoader workers, parse workers) do not hold it. Checkpoint directories
(runtime/checkpoint/lock.py) and prepared data (runtime/data/prepared)
take theirs through here, each with its own messages.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeld(Exception):
    """Another process holds the lock; `holder` is its pid as it wrote it ('unknown' if it did not)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by pid {holder}")
        self.path, self.holder = path, holder


class FileLock:
    """The exclusive lock of `path` (created, with its folder, if missing); `release()` when done.

    OSError when the file cannot be made or opened (a read-only folder), LockHeld when another
    process holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(self._fd, 32).decode("ascii", "replace").strip() or "unknown"
            self.release()
            raise LockHeld(path, holder) from None
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # a full disk: no lock without its holder's pid
            self.release()
            raise

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
