"""The one id-range check of the embedding collections, run before any kernel.

fbgemm's own bounds check is off in the collections (it clamps or warns
without naming the feature); this check names the feature, the id and the
table instead, and costs two vectorised comparisons per batch.
"""

from __future__ import annotations

import bisect
import itertools

import torch

__all__ = ["IdRangeCheck"]


class IdRangeCheck:
    """Checks the ids of a KeyedJaggedTensor's values, feature block by feature block.

    `features` lists, in the order of the value blocks, each feature's name and
    its table's name and row count. The per-id limits are cached for the last
    `length_per_key` and device seen.
    """

    def __init__(self, features: list[tuple[str, str, int]]) -> None:
        self.features = list(features)
        self._rows: dict[torch.device, torch.Tensor] = {}
        self._limits: tuple[tuple[int, ...], torch.device, torch.Tensor] | None = None

    def __call__(self, values: torch.Tensor, length_per_key: list[int]) -> None:
        """Raises IndexError for the first id outside [0, rows) of its feature's table."""
        key, device = tuple(length_per_key), values.device
        if self._limits is None or self._limits[:2] != (key, device):
            if device not in self._rows:
                rows = [rows for _, _, rows in self.features]
                self._rows[device] = torch.tensor(rows, device=device)
            counts = torch.tensor(length_per_key, device=device)
            limits = self._rows[device].repeat_interleave(counts, output_size=values.numel())
            self._limits = (key, device, limits)
        bad = values.ge(self._limits[2]).logical_or_(values.lt(0))
        if bad.any():
            position = int(bad.nonzero()[0])
            index = bisect.bisect_right(list(itertools.accumulate(length_per_key)), position)
            feature, table, rows = self.features[index]
            raise IndexError(
                f"feature {feature!r}: id {int(values[position])} out of range "
                f"for table {table!r} with {rows} rows"
            )
