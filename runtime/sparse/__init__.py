"""Jagged tensors (`JaggedTensor`, `KeyedJaggedTensor`, `KeyedTensor`), their validation, and sequences padded."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "jagged": ("JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"),
        "sequence": ("PaddedLayout", "padding_mask", "to_jagged", "to_padded", "truncate"),
    },
)
