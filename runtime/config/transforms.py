"""The spec's feature transforms as frozen, torch-free configs (what a generated module's INPUTS carries).

A sparse feature has at most one of `Vocabulary`, `Cross`, `Quantiles`,
`History` (none: its ids are hashed or taken as integers, today's `hash`
behaviour); a dense feature may have one `Numeric`, or one `Aggregate` (its
value made from the earlier rows of its key, then shaped as a `Numeric`). `kind` is the key of the
transform in runtime.features.registry and in the spec.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Union


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """Ids from a vocabulary learned on the training rows.

    Values seen at least `min_count` times, most frequent first (ties by the
    value's text), at most `max_size` of them, take rows `oov_buckets`,
    `oov_buckets + 1`, ...; every other value (rarer, beyond max_size, or
    unseen in training) takes one of the first `oov_buckets` rows (hashed
    among them when there are several)."""

    kind: ClassVar[str] = "vocabulary"
    min_count: int = 1
    max_size: int | None = None
    oov_buckets: int = 1


@dataclass(frozen=True, slots=True)
class Cross:
    """One id per row: the hash of the row's values of `columns` (data columns), taken together."""

    kind: ClassVar[str] = "cross"
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))


@dataclass(frozen=True, slots=True)
class Quantiles:
    """`buckets` equal-frequency buckets of a dense feature's column, boundaries learned."""

    kind: ClassVar[str] = "quantiles"
    buckets: int = 2


@dataclass(frozen=True, slots=True)
class History:
    """The items of feature `of` in the training rows with the same `by` value and an earlier `time`; with
    `where` (column, value), only the training rows whose column equals the value (e.g. the liked ones)."""

    kind: ClassVar[str] = "history"
    of: str = ""
    by: str = ""
    time: str = ""
    where: tuple[str, float] | None = None

    def __post_init__(self) -> None:
        if self.where is not None:
            object.__setattr__(self, "where", (str(self.where[0]), float(self.where[1])))


@dataclass(frozen=True, slots=True)
class Numeric:
    """A dense feature's columns: missing values filled (`fill`: a number or "mean", learned), then
    clipped to `clip`, then `log` (log(1 + x), x below 0 taken as 0), then scaled (`scale`:
    "standardize" or "min_max", learned on the values as they are at that point)."""

    kind: ClassVar[str] = "numeric"
    fill: float | str | None = None
    clip: tuple[float, float] | None = None
    log: bool = False
    scale: str | None = None

    def __post_init__(self) -> None:
        if self.clip is not None:
            object.__setattr__(self, "clip", (float(self.clip[0]), float(self.clip[1])))


@dataclass(frozen=True, slots=True)
class Aggregate:
    """A dense feature of one column: an aggregate of the training rows with the same `by` value and a
    strictly earlier `time` (runtime.features.aggregate); `by` names one column, or several whose values
    together make the key (a movie among the rows of the same gender): `aggregate` "mean" (of column `of`, a number) or
    "count"; only the last `last` of those rows when given; of those, only the rows whose `sharing` column
    (a `|`-list) has a value in common with the row's own when given. Then clipped to `clip`, logged
    (`log`) and scaled (`scale`) as a `Numeric`, learned on the training rows' aggregates."""

    kind: ClassVar[str] = "aggregate"
    by: str | tuple[str, ...] = ""
    time: str = ""
    aggregate: str = "mean"
    of: str | None = None
    last: int | None = None
    sharing: str | None = None
    clip: tuple[float, float] | None = None
    log: bool = False
    scale: str | None = None

    def __post_init__(self) -> None:
        if self.clip is not None:
            object.__setattr__(self, "clip", (float(self.clip[0]), float(self.clip[1])))
        if isinstance(self.by, list):
            object.__setattr__(self, "by", tuple(self.by))

    @property
    def keys(self) -> tuple[str, ...]:
        """The columns whose values make a row's key: one, or several together."""
        return (self.by,) if isinstance(self.by, str) else self.by

    @property
    def reads(self) -> tuple[str, ...]:
        """The columns every row is read from (never `of`: only the training rows' `of` is read, while learning)."""
        return (*self.keys, self.time) + ((self.sharing,) if self.sharing is not None else ())


SparseTransform = Union[Vocabulary, Cross, Quantiles, History]
DenseTransform = Numeric | Aggregate


def config_json(config: Any) -> dict[str, Any]:
    """A transform config as plain data (tuples as lists), as features.json and manifests store it."""
    return json.loads(json.dumps(dataclasses.asdict(config)))
