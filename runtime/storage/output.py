"""Writing a command's output whole or not at all, and saying in one line why it could not be written.

A full disk (ENOSPC), a read-only file system (EROFS) or a folder the user
may not write reach the commands as OSError from deep inside a writer;
each command turns it into an `OutputError` whose message names the path and
the cause, and leaves nothing half-written behind:

    write_file(out / "scores.csv", write)      # a hidden partial file, renamed when whole
    with removed_on_error(out, out / "train", out / "test"):
        ...                                     # what did not exist before goes again on error
    with output_errors(out):                    # OSError -> OutputError naming `out`
        ...
    save_tensors(tensors, staging / "dense.pt") # a full disk an OSError, not torch's RuntimeError

Checkpoints follow the same rule their own way (runtime/checkpoint/files.py:
a `.partial` directory renamed when complete). Torch-free to import
(`save_tensors` imports torch when called).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

_T = TypeVar("_T")


class OutputError(Exception):
    """An output that could not be written; the message names the path and the cause."""


def cannot_write(path: Path | str, error: OSError) -> OutputError:
    """The one line for `error`, raised while writing `path`: the path the user named, not the hidden
    partial file or folder the error may name, which is gone by the time the line is read."""
    return OutputError(f"cannot write {path}: {_cause(error)}")


def _cause(error: OSError) -> str:
    """The system's words for the error; pyarrow's OSError carries its errno only in its text."""
    if error.strerror:
        return error.strerror
    found = re.search(r"\[errno (\d+)\]", str(error))
    return os.strerror(int(found.group(1))) if found else str(error) or type(error).__name__


@contextlib.contextmanager
def output_errors(path: Path | str) -> Iterator[None]:
    """Turn an OSError inside the block into an OutputError naming `path`."""
    try:
        yield
    except OSError as error:
        raise cannot_write(path, error) from None


@contextlib.contextmanager
def removed_on_error(*paths: Path) -> Iterator[None]:
    """On any exception in the block (Ctrl-C included), remove those of `paths` that did not exist
    before it, files or folders, last first; an OSError becomes an OutputError naming the first."""
    new = [path for path in paths if not os.path.lexists(path)]
    try:
        with output_errors(paths[0]):
            yield
    except BaseException:
        for path in reversed(new):
            _remove(path)
        raise


def write_file(output: Path, write: Callable[[object], _T], *, binary: bool = False) -> _T:
    """`write(stream)` into `output` atomically: a hidden partial file of this process (its name holds
    the pid, so two runs writing one output never share one) renamed over `output` once complete,
    removed otherwise. OSError becomes an OutputError naming the file."""
    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    try:
        with output_errors(output):
            output.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb" if binary else "w", **({} if binary else {"newline": ""})) as stream:
                result = write(stream)
            partial.replace(output)
    finally:
        with contextlib.suppress(OSError):  # on a read-only file system there is none to remove
            partial.unlink(missing_ok=True)
    return result


def save_tensors(obj: object, path: Path) -> None:
    """torch.save of `obj` to `path`, a full disk an OSError (see `save_to_file`)."""
    import torch  # only the callers that save tensors pay for it

    save_to_file(path, lambda stream: torch.save(obj, stream))


def save_to_file(path: Path, save: Callable[[Any], None]) -> None:
    """`save(stream)` (torch.save, torch.export.save) into `path`, an OSError of a write raised as
    itself: torch's writers swallow it and fail later with a RuntimeError that names neither the
    file nor the cause ('unexpected pos 768 vs 662')."""
    with open(path, "wb") as stream:
        recording = _Recording(stream)
        try:
            save(recording)
        except RuntimeError:
            if recording.error is not None:
                raise recording.error from None
            raise


class _Recording:
    """A binary stream that keeps the OSError of a failed write."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.error = stream, None

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
