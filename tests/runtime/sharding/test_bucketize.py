"""RowBuckets (runtime/sharding/bucketize.py) against a plain-Python bucketisation."""

from __future__ import annotations

import bisect

import pytest
import torch

from runtime.sharding.bucketize import RowBuckets

BATCH = 4


def reference(
    boundaries: list[list[int]], lengths: list[int], ids: list[int], weights: list[float] | None
) -> tuple[list[int], list[int], list[float] | None]:
    """Bucket = the last range starting at or before the id (empty ranges are skipped)."""
    keys, buckets = len(boundaries), max(len(b) for b in boundaries) - 1
    padded = [b + [b[-1]] * (buckets + 1 - len(b)) for b in boundaries]
    bags: dict[tuple[int, int, int], list[tuple[int, float | None]]] = {}
    position = 0
    for entry, length in enumerate(lengths):
        key, sample = divmod(entry, BATCH)
        for _ in range(length):
            bucket = bisect.bisect_right(padded[key], ids[position]) - 1
            weight = None if weights is None else weights[position]
            rebased = ids[position] - padded[key][bucket]
            bags.setdefault((bucket, key, sample), []).append((rebased, weight))
            position += 1
    out_lengths, out_ids, out_weights = [], [], []
    for bucket in range(buckets):
        for key in range(keys):
            for sample in range(BATCH):
                bag = bags.get((bucket, key, sample), [])
                out_lengths.append(len(bag))
                out_ids.extend(i for i, _ in bag)
                out_weights.extend(w for _, w in bag)
    return out_lengths, out_ids, None if weights is None else out_weights


BOUNDARIES = {
    "even": [[0, 5, 10], [0, 7, 14]],
    "uneven": [[0, 9, 10], [0, 1, 14]],
    "empty first and middle ranges": [[0, 0, 10], [0, 6, 6, 14]],
    "one key on fewer shards": [[0, 10], [0, 3, 9, 14]],
}


@pytest.mark.parametrize("name", BOUNDARIES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("weighted", [False, True])
def test_row_buckets_match_python(name: str, dtype: torch.dtype, weighted: bool) -> None:
    boundaries = BOUNDARIES[name]
    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(0, 5, (len(boundaries) * BATCH,), generator=gen)
    rows = [b[-1] for b in boundaries]
    ids = torch.cat(
        [
            torch.randint(0, rows[k], (int(n),), generator=gen)
            for k, n in enumerate(lengths.view(len(boundaries), BATCH).sum(1))
        ]
    ).to(dtype)
    weights = torch.rand(ids.numel(), generator=gen) if weighted else None

    got_lengths, got_ids, got_weights = RowBuckets(boundaries)(lengths.to(dtype), ids, weights)

    want_lengths, want_ids, want_weights = reference(
        boundaries, lengths.tolist(), ids.tolist(), None if weights is None else weights.tolist()
    )
    assert got_lengths.tolist() == want_lengths
    assert got_ids.tolist() == want_ids
    assert got_ids.dtype == dtype
    if weighted:
        assert got_weights.tolist() == want_weights
    else:
        assert got_weights is None
