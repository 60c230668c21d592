"""`numeric`: a dense feature's columns filled, clipped, logged and scaled, with what is learned.

Per column, in this order: a missing value (an empty field) becomes `fill`
(a number, or "mean": the mean of the column's present training values;
without `fill`, 0 as before transforms), then is clipped to `clip`, then
`log` takes log(1 + max(x, 0)), then `scale` standardizes ((x - mean) / std,
std 1 when the column is constant) or maps [min, max] to [0, 1] (range 1 when
constant), the mean, std, min and max being those of the training values as
they are after the earlier steps (missing ones included, filled). fit keeps
sums (float64) that add up across files and processes; apply computes in
float64 and returns float32, the precision of dense columns.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from runtime.config.transforms import Numeric

VERSION = 1
_SUMS = ("present", "raw_sum", "missing", "sum", "sumsq", "min", "max")


def _shaped(config: Numeric, values: torch.Tensor, fill: torch.Tensor | None) -> torch.Tensor:
    """Fill (when given), clip and log, in float64."""
    x = values.double()
    if fill is not None:
        x = torch.where(torch.isnan(x), fill, x)
    if config.clip is not None:
        x = x.clamp(config.clip[0], config.clip[1])
    if config.log:
        x = torch.log1p(x.clamp_min(0.0))
    return x


class NumericTransform:
    kind, version = Numeric.kind, VERSION

    def fit(self, config: Numeric, raw: torch.Tensor) -> dict[str, list[float]]:
        """Sums of one chunk: `raw` is [n, size], NaN where a field was empty."""
        present = ~torch.isnan(raw)
        shaped = _shaped(config, raw, None)
        inf = torch.tensor(float("inf"), dtype=torch.float64)
        return {
            "present": present.sum(0).double().tolist(),
            "raw_sum": torch.where(present, raw.double(), 0.0).sum(0).tolist(),
            "missing": (~present).sum(0).double().tolist(),
            "sum": torch.where(present, shaped, 0.0).sum(0).tolist(),
            "sumsq": torch.where(present, shaped * shaped, 0.0).sum(0).tolist(),
            "min": torch.where(present, shaped, inf).amin(0).tolist() if len(raw) else [float("inf")] * raw.shape[1],
            "max": torch.where(present, shaped, -inf).amax(0).tolist() if len(raw) else [-float("inf")] * raw.shape[1],
        }

    def merge(self, config: Numeric, partials: Sequence[dict[str, list[float]]]) -> dict[str, list[float]]:
        merged = {key: [sum(values) for values in zip(*(p[key] for p in partials))] for key in _SUMS[:5]}
        merged["min"] = [min(values) for values in zip(*(p["min"] for p in partials))]
        merged["max"] = [max(values) for values in zip(*(p["max"] for p in partials))]
        return merged

    def finish(self, config: Numeric, partial: dict[str, list[float]], rows: int | None) -> dict[str, list[float]]:
        """Per column: the fill value (raw), and the mean, std, min, max after fill, clip and log."""
        state: dict[str, list[float]] = {key: [] for key in ("fill", "mean", "std", "min", "max")}
        for j, present in enumerate(partial["present"]):
            missing = partial["missing"][j]
            if config.fill == "mean":
                fill = partial["raw_sum"][j] / present if present else 0.0
            else:
                fill = 0.0 if config.fill is None else float(config.fill)
            filled = float(_shaped(config, torch.tensor([fill], dtype=torch.float64), None)[0])
            n = present + missing
            total = partial["sum"][j] + missing * filled
            mean = total / n if n else 0.0
            var = max((partial["sumsq"][j] + missing * filled * filled) / n - mean * mean, 0.0) if n else 0.0
            low = min(partial["min"][j], filled) if missing else partial["min"][j]
            high = max(partial["max"][j], filled) if missing else partial["max"][j]
            for key, value in zip(state, (fill, mean, var**0.5, low if n else 0.0, high if n else 0.0)):
                state[key].append(value)
        return state

    def without_values(self, config: Numeric, partial: dict[str, list[float]]) -> str | None:
        """Which columns no training row had a value in (each learned a constant), or None."""
        empty = [j for j, present in enumerate(partial["present"]) if not present]
        if not empty:
            return None
        which = (
            "its column" if len(partial["present"]) == 1 else "column " + ", ".join(str(j) for j in empty) + " of it"
        )
        return f"{which} has no value in any training row: it is the same constant in every row"

    def dump(self, state: dict[str, list[float]]) -> dict[str, Any]:
        return state

    def load(self, data: dict[str, Any]) -> dict[str, list[float]]:
        return data

    def describe(self, config: Numeric, state: dict[str, list[float]]) -> str:
        keys = ("fill", "mean", "std", "min", "max")
        learned = [f"{key} {', '.join(f'{v:.6g}' for v in state[key])}" for key in keys]
        return "numeric: " + "; ".join(learned)

    def apply(self, config: Numeric, state: dict[str, list[float]], raw: torch.Tensor) -> torch.Tensor:
        """[n, size] float32 model values of `raw` ([n, size], NaN where a field was empty)."""
        x = _shaped(config, raw, torch.tensor(state["fill"], dtype=torch.float64))
        if config.scale == "standardize":
            std = torch.tensor(state["std"], dtype=torch.float64)
            x = (x - torch.tensor(state["mean"], dtype=torch.float64)) / torch.where(std > 0, std, 1.0)
        elif config.scale == "min_max":
            low, high = (torch.tensor(state[key], dtype=torch.float64) for key in ("min", "max"))
            x = (x - low) / torch.where(high > low, high - low, 1.0)
        return x.float()
