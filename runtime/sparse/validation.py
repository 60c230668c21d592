"""Layout checks behind `validate()` of the classes in runtime/sparse/jagged.py.

A leaf: the checks take plain tensors and lists and import nothing of the
runtime, so the jagged tensors use them without an import circle.

They sync with the device, so the hot path never runs them; data readers
and tests do, on untrusted input. Every failure is a ValueError that names
the class, the key or sample, and the numbers.
"""

from __future__ import annotations

import torch

_INDEX_DTYPES = (torch.int32, torch.int64)


def _first_true(mask: torch.Tensor) -> int | None:
    hits = mask.nonzero()
    return int(hits[0, 0]) if hits.numel() else None


def check_keys(owner: str, keys: list[str]) -> None:
    """Keys are strings and unique."""
    for i, key in enumerate(keys):
        if not isinstance(key, str):
            raise ValueError(f"{owner}: key {i} must be a string, got {key!r}")
        if keys.index(key) != i:
            raise ValueError(f"{owner}: key {key!r} appears {keys.count(key)} times in keys")


class _Where:
    """Names entry i of lengths in messages: a sample, or a key and a sample."""

    def __init__(self, stride: int, keys: list[str] | None) -> None:
        self.stride, self.keys = stride, keys
        self.entries = stride if keys is None else len(keys) * stride
        self.text = f"{stride} samples" if keys is None else f"{len(keys)} keys x stride {stride}"

    def __call__(self, i: int) -> tuple[str, str]:
        """(subject, suffix) of a message about entry i."""
        if self.keys is None:
            return f"sample {i}", ""
        return f"key {self.keys[i // self.stride]!r}", f" at sample {i % self.stride}"


def check_layout(
    owner: str, tensors: dict[str, torch.Tensor | None], stride: int, keys: list[str] | None = None
) -> None:
    """Checks a jagged layout: values, weights, lengths and/or offsets agree.

    `tensors` maps "values", "weights", "lengths" and "offsets" to the tensors
    held (lengths or offsets may be None, not both). A JaggedTensor passes its
    number of samples as `stride` and no keys.
    """
    where = _Where(stride, keys)
    values, weights = tensors["values"], tensors["weights"]
    lengths, offsets = tensors["lengths"], tensors["offsets"]
    if values.dim() == 0:
        raise ValueError(f"{owner}: values must have a jagged dimension, got a scalar")
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if tensor.device != values.device:
            raise ValueError(f"{owner}: {name} is on {tensor.device} but values on {values.device}")
        if name != "values" and tensor.dim() != 1:
            raise ValueError(f"{owner}: {name} must be 1-D, got shape {tuple(tensor.shape)}")
        if name in ("lengths", "offsets") and tensor.dtype not in _INDEX_DTYPES:
            raise ValueError(f"{owner}: {name} must be int32 or int64, got {tensor.dtype}")
    if lengths is not None and lengths.numel() != where.entries:
        raise ValueError(f"{owner}: lengths has {lengths.numel()} entries but {where.text} need {where.entries}")
    if offsets is not None:
        total = _check_offsets(owner, where, offsets, lengths)
    else:
        i = _first_true(lengths < 0)
        if i is not None:
            subject, suffix = where(i)
            raise ValueError(f"{owner}: {subject} has a negative length {int(lengths[i])}{suffix}")
        total = int(lengths.sum())
    if total != values.size(0):
        raise ValueError(f"{owner}: sum(lengths)={total} but values has {values.size(0)} entries")
    if weights is not None and weights.numel() != values.size(0):
        raise ValueError(f"{owner}: weights has {weights.numel()} entries but values has {values.size(0)}")


def _check_offsets(owner: str, where: _Where, offsets: torch.Tensor, lengths: torch.Tensor | None) -> int:
    """Offsets start at 0, never decrease and agree with lengths; returns their total."""
    if offsets.numel() != where.entries + 1:
        raise ValueError(f"{owner}: offsets has {offsets.numel()} entries but {where.text} need {where.entries + 1}")
    if int(offsets[0]) != 0:
        raise ValueError(f"{owner}: offsets must start at 0, got {int(offsets[0])}")
    steps = offsets[1:] - offsets[:-1]
    i = _first_true(steps < 0)
    if i is not None:
        subject, suffix = where(i)
        raise ValueError(
            f"{owner}: {subject} has offsets decreasing from {int(offsets[i])} to {int(offsets[i + 1])}{suffix}"
        )
    i = None if lengths is None else _first_true(steps != lengths)
    if i is not None:
        subject, suffix = where(i)
        raise ValueError(f"{owner}: {subject} has length {int(lengths[i])} but offsets give {int(steps[i])}{suffix}")
    return int(offsets[-1])


def check_per_key_caches(
    keys: list[str],
    length_per_key: list[int],
    offset_per_key: list[int],
    claimed_lengths: list[int] | None,
    claimed_offsets: list[int] | None,
) -> None:
    """Per-key lists a caller passed in agree with the ones computed from the lengths."""
    owner = "KeyedJaggedTensor"
    if claimed_lengths is not None:
        if len(claimed_lengths) != len(keys):
            raise ValueError(f"{owner}: length_per_key has {len(claimed_lengths)} entries for {len(keys)} keys")
        for key, said, got in zip(keys, claimed_lengths, length_per_key):
            if said != got:
                raise ValueError(
                    f"{owner}: length_per_key says key {key!r} has {said} values but its lengths sum to {got}"
                )
    if claimed_offsets is not None and list(claimed_offsets) != offset_per_key:
        raise ValueError(f"{owner}: offset_per_key={list(claimed_offsets)} but lengths give {offset_per_key}")


def check_keyed_tensor(keys: list[str], length_per_key: list[int], values: torch.Tensor) -> None:
    """A KeyedTensor's keys, per-key widths and B x sum(widths) values agree."""
    owner = "KeyedTensor"
    check_keys(owner, keys)
    if len(length_per_key) != len(keys):
        raise ValueError(f"{owner}: length_per_key has {len(length_per_key)} entries for {len(keys)} keys")
    for key, n in zip(keys, length_per_key):
        if n < 0:
            raise ValueError(f"{owner}: key {key!r} has a negative length {n}")
    if values.dim() != 2:
        raise ValueError(f"{owner}: values must be 2-D, got shape {tuple(values.shape)}")
    if sum(length_per_key) != values.size(1):
        raise ValueError(f"{owner}: sum(length_per_key)={sum(length_per_key)} but values has {values.size(1)} columns")
