"""`quantiles: N`: a dense column cut into N equal-frequency buckets, the boundaries learned.

fit keeps the column's present (non-empty) raw values; partials join, and
past 2**20 values a partial keeps every k-th of them sorted (a systematic
sample, the same whatever the order of the merge). finish takes the values
at ranks i*n/N (i = 1..N-1) of the sorted values as boundaries, dropping
repeats (in float32, the precision of dense values), so a column with few
distinct values has fewer buckets and some of the N rows stay unused.
apply buckets like `boundaries` (runtime.data.feature_columns.bucketize: a
value equal to a boundary goes above it) the raw value, before the dense
feature's clip, log and scaling; an empty field takes the dense feature's
fill (its learned mean with `fill: mean`, else its fill value or 0).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from runtime.config.transforms import Quantiles

VERSION = 1
MAX_VALUES = 1 << 20


def _sample(values: list[float]) -> list[float]:
    values.sort()
    if len(values) <= MAX_VALUES:
        return values
    step = -(-len(values) // MAX_VALUES)
    return values[::step]


class QuantilesTransform:
    kind, version = Quantiles.kind, VERSION

    def fit(self, config: Quantiles, raw: torch.Tensor) -> list[float]:
        return _sample(raw[~torch.isnan(raw)].double().tolist())

    def merge(self, config: Quantiles, partials: Sequence[list[float]]) -> list[float]:
        return _sample([value for partial in partials for value in partial])

    def finish(self, config: Quantiles, partial: list[float], rows: int | None) -> dict[str, Any]:
        n = len(partial)
        cuts = [partial[min(n - 1, i * n // config.buckets)] for i in range(1, config.buckets)] if n else []
        as_float32 = torch.tensor(cuts, dtype=torch.float32).tolist()
        return {"boundaries": sorted(set(as_float32)), "values": n}

    def without_values(self, config: Quantiles, partial: list[float]) -> str | None:
        """Whether no training row had a value (one bucket learned for all), or None."""
        return None if partial else "no training row has a value: every row falls in one bucket"

    def dump(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def load(self, data: dict[str, Any]) -> dict[str, Any]:
        return data

    def describe(self, config: Quantiles, state: dict[str, Any]) -> str:
        cuts = len(state["boundaries"])
        return f"{cuts + 1} quantile buckets of {config.buckets} (from {state['values']:,} values)"

    def apply(self, config: Quantiles, state: dict[str, Any], raw: torch.Tensor, fill: float) -> torch.Tensor:
        """int64 bucket ids of `raw` (1-d, NaN where empty: takes `fill`)."""
        values = torch.where(torch.isnan(raw), torch.tensor(fill, dtype=raw.dtype), raw).float()
        boundaries = torch.tensor(state["boundaries"], dtype=torch.float32)
        return torch.bucketize(values.contiguous(), boundaries, right=True)
