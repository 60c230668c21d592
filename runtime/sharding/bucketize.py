"""Row bucketisation for the row-sharded types (row_wise, table_row_wise).

`RowBuckets` puts each id of a batch into the bucket of the shard whose row
range holds it and rebases the id to that shard's first row. It is one call
of fbgemm's `block_bucketize_sparse_features` given every key's shard
boundaries (`block_bucketize_pos`), so uneven shards, empty shards and tables
split over fewer ranks than others (table_row_wise hosts) all take the same
vectorised path. Output layout: lengths [bucket][key][sample], ids and
weights in that order, each bag keeping the order of its ids.
"""

from __future__ import annotations

from typing import Sequence

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch


_Tensors = tuple[torch.Tensor, list[torch.Tensor]]


class RowBuckets:
    """Bucketises ids by row range; `boundaries[k]` lists key k's shard row offsets, then its rows.

    Keys with fewer shards than others get empty trailing buckets.
    """

    def __init__(self, boundaries: Sequence[Sequence[int]]) -> None:
        self.buckets = max(len(b) for b in boundaries) - 1
        self._boundaries = [list(b) + [b[-1]] * (self.buckets + 1 - len(b)) for b in boundaries]
        # Any non-zero block size: with explicit boundaries fbgemm only asks that it is not 0.
        self._block_sizes = [max(1, b[1] - b[0]) for b in self._boundaries]
        # (block sizes, boundaries) per ids dtype and device
        self._tensors: dict[tuple[torch.dtype, torch.device], _Tensors]
        self._tensors = {}

    def __call__(
        self, lengths: torch.Tensor, values: torch.Tensor, weights: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(lengths [bucket][key][sample], rebased ids, weights) of a key-major batch."""
        block_sizes, positions = self._as_tensors(values.dtype, values.device)
        bucketised = torch.ops.fbgemm.block_bucketize_sparse_features(
            lengths, values, False, False, block_sizes, self.buckets, weights, None, -1, positions
        )
        return bucketised[0], bucketised[1], bucketised[2]

    def with_positions(
        self, lengths: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(lengths, rebased ids, and for each input id its position among the bucketised ids).

        The positions take looked-up rows back to their ids' places (sequences).
        """
        block_sizes, positions = self._as_tensors(values.dtype, values.device)
        bucketised = torch.ops.fbgemm.block_bucketize_sparse_features(
            lengths, values, False, True, block_sizes, self.buckets, None, None, -1, positions
        )
        return bucketised[0], bucketised[1], bucketised[4]

    def _as_tensors(self, dtype: torch.dtype, device: torch.device) -> _Tensors:
        # fbgemm reads block sizes and boundaries with the ids' integer type.
        key = (dtype, device)
        if key not in self._tensors:
            self._tensors[key] = (
                torch.tensor(self._block_sizes, dtype=dtype, device=device),
                [torch.tensor(b, dtype=dtype, device=device) for b in self._boundaries],
            )
        return self._tensors[key]
