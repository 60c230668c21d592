"""The one check of a batch's ids: its jagged layout and every id against its table's rows.

fbgemm's kernels trust the KeyedJaggedTensor they are given: offsets that
decrease, negative lengths, lengths that do not add up to the values or ids
past a table's last row make them read outside the batch or the table and
return numbers that change from run to run. `IdCheck` runs where a batch
first arrives, before any kernel: `EmbeddingBagCollection.forward`, the
`input_dist` of every sharding type (runtime/sharding/, the local one at
world size 1 included) and, to name the culprit after its own kernel
refused a batch, the quantized serving collection.

The fast path is a handful of vectorised ops over lengths and values and
one read of a small tensor (the per-key value counts, which the lookup needs
anyway and gets cached on the batch, plus the smallest length and the id
range); only when that read shows a problem does the slow path look for the
first culprit and raise a ValueError naming the key, the sample and the
numbers.

>>> check = IdCheck(["f0"], ["table 't0'"], [10])
>>> kjt = KeyedJaggedTensor(["f0"], torch.tensor([3, 12]), lengths=torch.tensor([1, 1]))
>>> check(kjt)
Traceback (most recent call last):
...
runtime.embeddings.ids.IdOutOfRange: feature 'f0' at sample 1: id 12 out of range for table 't0' with 10 rows
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Sequence

import torch

from runtime.sparse import validation
from runtime.sparse.jagged import KeyedJaggedTensor

__all__ = ["IdCheck", "IdOutOfRange"]

_OWNER = "KeyedJaggedTensor"
_ID_DTYPES = (torch.int32, torch.int64)
_NO_LIMIT = torch.iinfo(torch.int64).max


class IdOutOfRange(ValueError, IndexError):
    """An id below 0 or past its table's rows (an IndexError too, as indexing errors are)."""


class IdCheck:
    """Checks a KeyedJaggedTensor's layout and its ids against `rows` (see the module docstring).

    `features[i]` is looked up in the table that `tables[i]` describes (`table 't' (spec:line:col)`,
    as `EmbeddingBagConfig.describe()` gives it) of `rows[i]` rows; keys of
    the batch not in `features` are checked for layout only. `rank`, when
    given, is named in messages (the rank that read the batch).
    """

    def __init__(
        self,
        features: Sequence[str],
        tables: Sequence[str],
        rows: Sequence[int],
        rank: int | None = None,
    ) -> None:
        # A feature that several tables read is checked against the one of fewest rows.
        self._table_of: dict[str, tuple[str, int]] = {}
        for feature, table, count in zip(features, tables, rows):
            if feature not in self._table_of or count < self._table_of[feature][1]:
                self._table_of[feature] = (table, count)
        self._suffix = "" if rank is None else f" (on rank {rank})"
        # Per key order of incoming batches: rows per key, and the one limit if all keys share it.
        self._limits: dict[tuple[tuple[str, ...], torch.device], _KeyLimits] = {}

    def __call__(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """`kjt` checked, with its per-key value counts known; raises ValueError naming the fault."""
        if not self._suffix:
            return self._checked(kjt)
        try:
            return self._checked(kjt)
        except ValueError as error:
            raise type(error)(f"{error}{self._suffix}") from None

    def _checked(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        values, keys, stride = kjt.values(), kjt.keys(), kjt.stride()
        _check_shapes(kjt)
        if not keys or stride == 0:
            if values.numel():
                raise ValueError(f"{_OWNER}: sum(lengths)=0 but values has {values.numel()} entries")
            return kjt
        limits = self._key_limits(keys, values.device)
        lengths, offsets = kjt.lengths(), kjt.offsets_or_none()
        # One read: the per-key counts, the smallest length, the first offset, the id range.
        summary = [lengths.view(len(keys), stride).sum(dim=1), lengths.min().view(1)]
        summary.append(lengths.new_zeros(1) if offsets is None else offsets[:1])
        if values.numel():
            summary.append(torch.stack(values.aminmax()))
        numbers = torch.cat([s.to(torch.int64) for s in summary]).tolist()
        length_per_key, (shortest, first_offset, *id_range) = numbers[: len(keys)], numbers[len(keys) :]
        if shortest < 0 or first_offset != 0 or sum(length_per_key) != values.numel():
            raise self._layout_error(kjt)
        checked = _with_counts(kjt, length_per_key)
        if id_range and (id_range[0] < 0 or id_range[1] >= limits.fewest_rows):
            if limits.shared or _any_out_of_range(values, limits, length_per_key):
                raise self.id_error(checked)
        return checked

    def explain(self, kjt: KeyedJaggedTensor) -> ValueError:
        """The error that names what is wrong with `kjt` (for a batch a kernel refused)."""
        try:
            self(kjt)
        except ValueError as error:
            return error
        return ValueError(
            f"{_OWNER}: the kernel refused a batch of {len(kjt.keys())} keys x stride "
            f"{kjt.stride()} with {kjt.values().numel()} ids that passes every check"
        )

    def id_error(self, kjt: KeyedJaggedTensor) -> IdOutOfRange:
        """The first id out of range in a batch whose layout is sound."""
        values, keys = kjt.values(), kjt.keys()
        limits = self._key_limits(keys, values.device)
        bad = _out_of_range(values, limits, kjt.length_per_key())
        position = int(bad.nonzero()[0, 0])
        k = bisect.bisect_right(kjt.offset_per_key(), position) - 1
        offsets = kjt.offsets()
        entry = int(torch.searchsorted(offsets, torch.tensor(position, dtype=offsets.dtype), right=True)) - 1
        table, rows = self._table_of[keys[k]]
        return IdOutOfRange(
            f"feature {keys[k]!r} at sample {entry - k * kjt.stride()}: id {int(values[position])} "
            f"out of range for {table} with {rows} rows"
        )

    def _layout_error(self, kjt: KeyedJaggedTensor) -> ValueError:
        tensors = {"values": kjt.values(), "weights": kjt.weights_or_none()}
        tensors |= {"lengths": kjt.lengths_or_none(), "offsets": kjt.offsets_or_none()}
        try:
            validation.check_layout(_OWNER, tensors, kjt.stride(), kjt.keys())
        except ValueError as error:
            return error
        return ValueError(f"{_OWNER}: lengths and values disagree")

    def _key_limits(self, keys: list[str], device: torch.device) -> _KeyLimits:
        cache = (tuple(keys), device)
        if cache not in self._limits:
            checked = [k in self._table_of for k in keys]
            rows = [self._table_of[k][1] if c else _NO_LIMIT for k, c in zip(keys, checked)]
            self._limits[cache] = _KeyLimits(
                rows=torch.tensor(rows, dtype=torch.int64, device=device),
                checked=torch.tensor(checked, device=device),
                fewest_rows=min(rows),
                shared=all(checked) and len(set(rows)) == 1,
            )
        return self._limits[cache]


@dataclass(frozen=True)
class _KeyLimits:
    """The rows of each key's table in one key order (keys without a table: no limit)."""

    rows: torch.Tensor
    checked: torch.Tensor
    fewest_rows: int
    shared: bool  # every key checked against the same number of rows: the id range decides


def _any_out_of_range(values: torch.Tensor, limits: _KeyLimits, length_per_key: list[int]) -> bool:
    """Whether any id lies outside its key's table: one reduction when keys hold as many ids."""
    if len(set(length_per_key)) == 1 and values.numel():
        low, high = values.view(len(length_per_key), -1).aminmax(dim=1)
        return bool(high.ge(limits.rows).logical_or_(low.lt(0)).logical_and_(limits.checked).any())
    return bool(_out_of_range(values, limits, length_per_key).any())


def _out_of_range(values: torch.Tensor, limits: _KeyLimits, length_per_key: list[int]) -> torch.Tensor:
    """Which ids lie outside their key's table."""
    counts = torch.tensor(length_per_key, device=values.device)
    rows = limits.rows.repeat_interleave(counts, output_size=values.numel())
    checked = limits.checked.repeat_interleave(counts, output_size=values.numel())
    # a key without a table (timestamps) takes any int64, its largest included
    return values.ge(rows).logical_or_(values.lt(0)).logical_and_(checked)


def _check_shapes(kjt: KeyedJaggedTensor) -> None:
    """What is known without reading a tensor: dtypes, dimensions and entry counts."""
    values, keys, stride = kjt.values(), kjt.keys(), kjt.stride()
    if values.dim() != 1:
        raise ValueError(f"{_OWNER}: values must be 1-D, got shape {tuple(values.shape)}")
    if values.dtype not in _ID_DTYPES:
        named = ", ".join(repr(k) for k in keys)
        raise ValueError(f"{_OWNER}: the ids of keys {named} are {values.dtype}; ids must be int32 or int64")
    entries = len(keys) * stride
    given = (("lengths", kjt.lengths_or_none(), entries), ("offsets", kjt.offsets_or_none(), entries + 1))
    for name, tensor, need in given:
        if tensor is None:
            continue
        if tensor.dtype not in _ID_DTYPES:
            raise ValueError(f"{_OWNER}: {name} must be int32 or int64, got {tensor.dtype}")
        if tensor.dim() != 1 or tensor.numel() != need:
            raise ValueError(
                f"{_OWNER}: {name} has {tensor.numel()} entries but {len(keys)} keys x stride {stride} need {need}"
            )
    weights = kjt.weights_or_none()
    if weights is not None and weights.numel() != values.numel():
        raise ValueError(f"{_OWNER}: weights has {weights.numel()} entries but values has {values.numel()}")


def _with_counts(kjt: KeyedJaggedTensor, length_per_key: list[int]) -> KeyedJaggedTensor:
    """`kjt` carrying the per-key counts just read; counts a caller passed in must agree."""
    claimed = kjt.length_per_key_or_none()
    if claimed is not None:
        for key, said, got in zip(kjt.keys(), claimed, length_per_key):
            if said != got:
                raise ValueError(
                    f"{_OWNER}: length_per_key says key {key!r} has {said} values but its lengths sum to {got}"
                )
    starts = list(itertools.accumulate(length_per_key, initial=0))
    claimed_starts = kjt.offset_per_key_or_none()
    if claimed_starts is not None and list(claimed_starts) != starts:
        raise ValueError(f"{_OWNER}: offset_per_key={list(claimed_starts)} but lengths give {starts}")
    return KeyedJaggedTensor(
        kjt.keys(),
        kjt.values(),
        kjt.weights_or_none(),
        lengths=kjt.lengths(),
        offsets=kjt.offsets_or_none(),
        stride=kjt.stride(),
        length_per_key=length_per_key,
        offset_per_key=starts,
    )
