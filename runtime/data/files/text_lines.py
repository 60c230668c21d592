"""Line-oriented data files: plain or gzip, one file or a directory of day files.

The Criteo and MovieLens readers read their files through here. A path is a
file or a directory (its files in natural order: day_2 before day_10).
Lines come out as bytes without their ending (LF or CRLF), numbered from 1
within each file, so every error can name FILE:LINE. Gzip is recognised by
its magic bytes, not by the file name. Nothing is read ahead beyond one
line: memory does not depend on the file size.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import BinaryIO, Iterator

from runtime.data.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
_DIGITS = re.compile(r"(\d+)")


def data_files(path: str | Path) -> list[Path]:
    """The files of `path`: itself, or a directory's visible files in natural order."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.exists():
        raise DataError(f"{path}: no such file or directory")
    if not root.is_dir():  # a device, a pipe, a socket: nothing a reader can take as data
        raise DataError(f"{path}: not a regular file or a directory of data files")
    try:
        files = [p for p in root.iterdir() if p.is_file() and not p.name.startswith(".")]
    except OSError as error:
        raise DataError(f"{path}: cannot list the directory: {error.strerror}") from None
    if not files:
        raise DataError(f"{path}: the directory holds no data files")
    return sorted(files, key=_natural_key)


def open_binary(path: Path) -> BinaryIO:
    """`path` opened for reading bytes, decompressed when it is gzip."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == GZIP_MAGIC:
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def numbered_lines(path: Path, skip: int = 0) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line without its LF / CRLF) for every line after the first `skip`."""
    number = 0
    with open_binary(path) as stream:
        try:
            for number, line in enumerate(stream, start=1):
                if number > skip:
                    yield number, line.rstrip(b"\r\n")
        except (OSError, EOFError) as error:  # a truncated or corrupt gzip stream
            raise DataError(f"{path}: cannot read past line {number}: {error}") from error


def first_line(path: Path) -> bytes | None:
    """The first line of `path` without its ending, or None for an empty file."""
    for _, line in numbered_lines(path):
        return line
    return None


def _natural_key(path: Path) -> list[object]:
    return [int(part) if part.isdigit() else part for part in _DIGITS.split(path.name)]
