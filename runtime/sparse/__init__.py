"""Jagged tensors: `JaggedTensor`, `KeyedJaggedTensor`, `KeyedTensor`, and their validation."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(globals(), {"jagged": ("JaggedTensor", "KeyedJaggedTensor", "KeyedTensor")})
