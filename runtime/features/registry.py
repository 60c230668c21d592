"""Every feature transform, keyed by its kind in the spec (runtime.config.transforms's `kind`).

A transform is an object with `kind`, `version` and the methods fit, merge,
finish, dump, load and apply (runtime.features.__init__ says what each does).
`version` is stored with every learned state: a state written by another
version is refused, never reinterpreted.
"""

from __future__ import annotations

from typing import Any

from runtime.features.aggregate import AggregateTransform
from runtime.features.hashing import CrossTransform
from runtime.features.history import HistoryTransform
from runtime.features.numeric import NumericTransform
from runtime.features.quantiles import QuantilesTransform
from runtime.features.vocabulary import VocabularyTransform

TRANSFORMS: dict[str, Any] = {
    t.kind: t
    for t in (
        VocabularyTransform(),
        CrossTransform(),
        QuantilesTransform(),
        HistoryTransform(),
        NumericTransform(),
        AggregateTransform(),
    )
}


def transform(kind: str) -> Any:
    """The transform of `kind`."""
    return TRANSFORMS[kind]
