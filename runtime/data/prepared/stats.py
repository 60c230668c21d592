"""Per-column statistics of prepared data: value ranges, counts, nulls; merged part by part.

    sparse / timestamps  rows, values (ids in all), empty_rows, min, max, nulls
    dense / weights      rows, values, min, max, nan, nulls
    label                rows, min, max, sum, nulls

Min and max are None for a column without values. Nulls are always 0 as
prepare writes them (a reader fills an empty field with 0), and are kept so
a manifest says so rather than leaving it to be assumed.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.data.columns import Columns


def part_stats(columns: Columns, specs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The statistics of each column of `specs` over the rows of `columns`."""
    stats: dict[str, dict[str, Any]] = {}
    rows = len(columns)
    for name, spec in specs.items():
        kind, key = spec["kind"], name.partition(".")[2]
        if kind in ("sparse", "timestamps"):
            jagged = columns.sparse[key]
            stats[name] = {
                "rows": rows,
                "values": int(jagged.values.numel()),
                "empty_rows": int((jagged.lengths == 0).sum()),
                **_range(jagged.values),
                "nulls": 0,
            }
        elif kind in ("dense", "weights"):
            values = columns.dense[key] if kind == "dense" else columns.sparse[spec["of"]].weights_or_ones()
            finite = values[~torch.isnan(values)]
            stats[name] = {
                "rows": rows,
                "values": int(values.numel()),
                **_range(finite),
                "nan": int(values.numel() - finite.numel()),
                "nulls": 0,
            }
        else:
            labels = columns.labels[key]
            stats[name] = {"rows": rows, **_range(labels), "sum": float(labels.double().sum()), "nulls": 0}
    return stats


def merge_stats(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The statistics of two row sets together (either may be empty: {})."""
    merged = {}
    for name in a.keys() | b.keys():
        one, other = a.get(name), b.get(name)
        if one is None or other is None:
            merged[name] = dict(one or other)  # type: ignore[arg-type]
            continue
        both: dict[str, Any] = {}
        for field, value in one.items():
            if field == "min":
                both[field] = _pick(min, value, other[field])
            elif field == "max":
                both[field] = _pick(max, value, other[field])
            else:
                both[field] = value + other[field]
        merged[name] = both
    return {name: merged[name] for name in [*a, *(n for n in b if n not in a)]}


def _range(values: torch.Tensor) -> dict[str, Any]:
    if values.numel() == 0:
        return {"min": None, "max": None}
    low, high = values.min().item(), values.max().item()
    return {"min": low, "max": high}


def _pick(choose: Any, one: Any, other: Any) -> Any:
    if one is None:
        return other
    if other is None:
        return one
    return choose(one, other)
