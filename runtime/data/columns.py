"""`Columns`: parsed rows as tensors, cut and joined by row before they become a `Batch`.

DataLoader workers turn blocks of lines into `Columns` (one tensor per
dense feature and label, a jagged (lengths, values, weights) triple per
sparse feature); the rank's assembler (`runtime.data.rank_slices`) joins blocks,
cuts global batches and its own share by row, and only then builds the
`KeyedJaggedTensor`. Sparse features are kept in the spec's order, which
is the key order of the batch, followed by the timestamps features. A
sequence feature and its timestamps are jagged like any bag (one int64 time
per id), so cutting by row keeps them aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.data.batch import Batch
from runtime.sparse.jagged import KeyedJaggedTensor

# The labels' entry holding each row's user id where per-user retrieval metrics need it
# (runtime.retrieval.head_metrics); no head reads it, and prepared data does not keep it.
USER_IDS = "_user_ids"


@dataclass(frozen=True, slots=True)
class Jagged:
    """One sparse feature of n rows: row i owns values[offsets[i]:offsets[i + 1]]."""

    lengths: torch.Tensor  # n, int64
    values: torch.Tensor  # sum(lengths), int64
    weights: torch.Tensor | None  # like values, float32; None: all ones

    @staticmethod
    def one_per_row(ids: torch.Tensor) -> Jagged:
        return Jagged(torch.ones(ids.numel(), dtype=torch.long), ids.long(), None)

    def slice(self, lo: int, hi: int) -> Jagged:
        offsets = self._offsets()
        a, b = int(offsets[lo]), int(offsets[hi])
        weights = None if self.weights is None else self.weights[a:b]
        return Jagged(self.lengths[lo:hi], self.values[a:b], weights)

    def weights_or_ones(self) -> torch.Tensor:
        return torch.ones(self.values.numel()) if self.weights is None else self.weights

    def _offsets(self) -> torch.Tensor:
        offsets = torch.zeros(self.lengths.numel() + 1, dtype=torch.long)
        torch.cumsum(self.lengths, 0, out=offsets[1:])
        return offsets


@dataclass(frozen=True, slots=True)
class Columns:
    """n parsed rows: dense features (n x size), sparse features (jagged), labels (n)."""

    dense: dict[str, torch.Tensor]
    sparse: dict[str, Jagged]
    labels: dict[str, torch.Tensor]

    def __len__(self) -> int:
        for tensor in (*self.dense.values(), *self.labels.values()):
            return int(tensor.shape[0])
        return next(iter(self.sparse.values())).lengths.numel() if self.sparse else 0

    def slice(self, lo: int, hi: int) -> Columns:
        """Rows lo..hi-1."""
        return Columns(
            {k: v[lo:hi] for k, v in self.dense.items()},
            {k: v.slice(lo, hi) for k, v in self.sparse.items()},
            {k: v[lo:hi] for k, v in self.labels.items()},
        )

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        """The rows of `parts`, one after the other (same features in each)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]

        def weights(name: str) -> torch.Tensor | None:
            if all(p.sparse[name].weights is None for p in parts):
                return None
            return torch.cat([p.sparse[name].weights_or_ones() for p in parts])

        return Columns(
            {k: torch.cat([p.dense[k] for p in parts]) for k in first.dense},
            {
                k: Jagged(
                    torch.cat([p.sparse[k].lengths for p in parts]),
                    torch.cat([p.sparse[k].values for p in parts]),
                    weights(k),
                )
                for k in first.sparse
            },
            {k: torch.cat([p.labels[k] for p in parts]) for k in first.labels},
        )

    def padded(self, size: int, filler: Columns) -> Columns:
        """These rows followed by copies of `filler`'s first row, `size` rows in all."""
        missing = size - len(self)
        if missing <= 0:
            return self
        return Columns.concat([self, *[filler.slice(0, 1)] * missing])

    def to_batch(self, weighted: bool) -> Batch:
        """The `Batch`: sparse keys in this order; per-id weights for every key when `weighted`."""
        keys = list(self.sparse)
        features = [self.sparse[k] for k in keys]
        values = torch.cat([f.values for f in features]) if features else torch.empty(0, dtype=torch.long)
        lengths = torch.cat([f.lengths for f in features]) if features else torch.empty(0, dtype=torch.long)
        weights = torch.cat([f.weights_or_ones() for f in features]) if weighted and features else None
        sparse = KeyedJaggedTensor.from_lengths_sync(keys, values, lengths, weights=weights, stride=len(self))
        return Batch(dense=dict(self.dense), sparse=sparse, labels=dict(self.labels))
