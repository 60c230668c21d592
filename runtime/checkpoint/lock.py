"""One writer per checkpoint directory: an exclusive POSIX lock on `DIR/.lock`, held while training.

The lock file keeps the holder's pid, so a second job is told who writes
there. The kernel drops the lock when the holder exits, however it exits,
so a killed job never leaves a stale lock behind. A POSIX (`lockf`) lock
belongs to the process, not to the open file: the DataLoader workers that
rank 0 forks do not hold it, so a rank that torchrun restarts gets it back
at once, without waiting for its predecessor's workers to notice and exit.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from runtime.checkpoint.files import CheckpointError

LOCK_FILE = ".lock"


class DirectoryLock:
    """The lock of one checkpoint directory (created if missing); `release()` when done."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:  # a read-only or foreign folder: a resume writes there too
            raise CheckpointError(
                f"--checkpoint-dir {directory}: cannot write its lock file {self.path}: {error.strerror}"
            ) from None
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(self._fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            raise CheckpointError(
                f"{directory} is in use by another training job (pid {holder}, lock {self.path}); "
                "wait for it to end or choose another --checkpoint-dir"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
