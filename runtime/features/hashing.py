"""`hash` and `cross`: ids without a learned state, the same on every machine.

An integer id (ASCII digits, an optional leading '-') is taken mod the
table's rows; any other value is hashed (blake2b, 64 bits, little-endian)
mod the rows. This is what every csv / parquet feature without a
`vocabulary` did before transforms were learned, and still does. A cross
hashes the text of its columns' values joined by the unit separator
(U+001F), so ("a", "bc") and ("ab", "c") differ; an empty field is the
empty text.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable, Sequence

from runtime.config.transforms import Cross

VERSION = 1
CROSS_SEPARATOR = "\x1f"
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits: str.isdigit() takes '²', which int() refuses


def hash_text(text: str) -> int:
    """The 64-bit hash of `text` every hashed value goes through."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def hash_id(item: Any, rows: int) -> int:
    """`item`'s row of `rows`: an integer mod rows, any other value hashed mod rows."""
    if isinstance(item, int) or (isinstance(item, str) and _INTEGER.fullmatch(item)):
        return int(item) % rows
    return hash_text(str(item)) % rows


def cross_text(values: Sequence[Any]) -> str:
    """One row's values of a cross's columns, as the one text that is hashed."""
    return CROSS_SEPARATOR.join("" if value is None else str(value) for value in values)


class CrossTransform:
    """`cross`: no state to learn (fit counts nothing); apply hashes the combined text."""

    kind, version = Cross.kind, VERSION

    def fit(self, config: Cross, raw: Iterable[Any]) -> dict[str, Any]:
        return {}

    def merge(self, config: Cross, partials: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def finish(self, config: Cross, partial: dict[str, Any], rows: int | None) -> dict[str, Any]:
        return {}

    def dump(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def load(self, data: dict[str, Any]) -> dict[str, Any]:
        return data

    def describe(self, config: Cross, state: dict[str, Any]) -> str:
        return f"cross of {', '.join(config.columns)}, hashed"

    def apply(self, config: Cross, state: dict[str, Any], raw: Sequence[str], rows: int) -> list[int]:
        return [hash_text(text) % rows for text in raw]
