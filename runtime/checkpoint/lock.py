"""One writer per checkpoint directory: an exclusive POSIX lock on `DIR/.lock`, held while training.

The lock itself is runtime/storage/lock.py's (the holder's pid in the file,
dropped by the kernel however the holder exits). A rank that torchrun
restarts gets it back at once: the DataLoader workers that rank 0 forks do
not hold it, so it need not wait for its predecessor's workers to exit.
"""

from __future__ import annotations

from pathlib import Path

from runtime.checkpoint.files import CheckpointError
from runtime.storage.lock import FileLock, LockHeld

LOCK_FILE = ".lock"


class DirectoryLock:
    """The lock of one checkpoint directory (created if missing); `release()` when done."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        try:
            self._lock = FileLock(self.path)
        except LockHeld as held:
            raise CheckpointError(
                f"{directory} is in use by another training job (pid {held.holder}, lock {self.path}); "
                "wait for it to end or choose another --checkpoint-dir"
            ) from None
        except OSError as error:  # a read-only or foreign folder: a resume writes there too
            raise CheckpointError(
                f"--checkpoint-dir {directory}: cannot write its lock file {self.path}: {error.strerror}"
            ) from None

    def release(self) -> None:
        self._lock.release()
