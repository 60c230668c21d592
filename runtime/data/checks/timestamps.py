"""The check that a batch's timestamps keys line up with their sequences: one time per id.

A timestamps feature (runtime.config.data.TimestampsConfig) is a key of
the sparse KeyedJaggedTensor with its sequence's lengths. The readers build
both from the same rows; this check stands where batches leave the loader
(runtime.data.loader) and `reccompile check` reads a sample, and any code
that builds batches by hand can call it, so a mismatch is named here, not
met as a shape error deep in an attention block.

>>> kjt = KeyedJaggedTensor.from_lengths_sync(["h", "h_time"], torch.tensor([4, 5, 6, 10, 20]),
...                                           torch.tensor([1, 2, 1, 1]))
>>> check_timestamps(kjt, [TimestampsConfig("h_time", "h")])
Traceback (most recent call last):
...
runtime.data.errors.DataError: timestamps feature 'h_time' at sample 1: 1 times but its sequence 'h' has 2 ids
"""

from __future__ import annotations

from typing import Sequence

import torch

from runtime.config.data import TimestampsConfig
from runtime.data.errors import DataError
from runtime.sparse.jagged import KeyedJaggedTensor


def check_timestamps(sparse: KeyedJaggedTensor, timestamps: Sequence[TimestampsConfig]) -> None:
    """Every timestamps feature is a key with its sequence's lengths; DataError naming the first sample that is not."""
    keys = sparse.keys()
    for stamps in timestamps:
        for name in (stamps.name, stamps.sequence):
            if name not in keys:
                raise DataError(f"timestamps feature {stamps.name!r}: the batch has no key {name!r}")
        times, ids = sparse[stamps.name].lengths(), sparse[stamps.sequence].lengths()
        differ = torch.nonzero(times != ids)
        if differ.numel():
            sample = int(differ[0, 0])
            raise DataError(
                f"timestamps feature {stamps.name!r} at sample {sample}: {int(times[sample])} times "
                f"but its sequence {stamps.sequence!r} has {int(ids[sample])} ids"
            )
