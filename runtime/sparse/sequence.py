"""Sequences between their jagged and padded forms, and their truncation.

A sequence feature reaches the blocks as a JaggedTensor: values [sum(L), D]
(embeddings) with lengths [B], most recent last. Attention blocks work on
the padded form [B, max_length, D] with a mask of the real positions;
`to_padded` and `to_jagged` convert on fbgemm's jagged ops (the gradient of
one is the other), and `truncate` cuts sequences longer than `max_length`,
keeping the most recent positions (the end) by default or the first ones.

A compiled model calls three more at the edges of its graph: `truncate_keyed`
cuts the sequence keys of the whole batch (and their timestamps) once at the
start of forward, `pool_rows` pools the rows of a pooled feature that a
sequence table looked up, and `pad_times` pads a timestamps key.
"""

from __future__ import annotations

from collections.abc import Mapping

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch

from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor

__all__ = [
    "KEEP_SIDES",
    "PaddedLayout",
    "pad_times",
    "padding_mask",
    "pool_rows",
    "to_jagged",
    "to_padded",
    "truncate",
    "truncate_keyed",
]
ROW_POOLING = ("sum", "mean")

KEEP_SIDES = ("end", "start")


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)


def _check_max_length(owner: str, max_length: object) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"{owner}: max_length must be an integer >= 1 (got {max_length!r})")
    return max_length


def padding_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """[B, max_length] bool, True at the real positions (j < lengths[b])."""
    positions = torch.arange(max_length, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


class PaddedLayout:
    """One batch's lengths and padded length, to convert many tensors without re-checking.

    Blocks run their position-wise work (projections, feed-forward, norms) on
    the real rows and pad only for attention; the checks of `to_padded` and
    `to_jagged` ran once on the block's input.
    """

    def __init__(self, lengths: torch.Tensor, length: int) -> None:
        self.lengths, self.length = lengths, length
        self.offsets = _offsets(lengths)
        self.total = int(self.offsets[-1])
        self.mask = padding_mask(lengths, length)

    def rows(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, length, ...] -> [sum(L), ...]."""
        return torch.ops.fbgemm.dense_to_jagged(padded, [self.offsets], self.total)[0]

    def padded(self, rows: torch.Tensor) -> torch.Tensor:
        """[sum(L), ...] -> [B, length, ...], zeros at the padding."""
        return torch.ops.fbgemm.jagged_to_padded_dense(rows, [self.offsets], [self.length], 0.0)


def to_padded(values: torch.Tensor, lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """[sum(L), D] rows with lengths [B] -> [B, max_length, D], zeros after each sequence.

    Every length must be at most `max_length` (see `truncate`).
    """
    _check_max_length("to_padded", max_length)
    if values.dim() != 2 or values.shape[0] != int(lengths.sum()):
        raise ValueError(
            f"to_padded: expected values of shape (sum(lengths) = {int(lengths.sum())}, D), got {tuple(values.shape)}"
        )
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > max_length:
        raise ValueError(
            f"to_padded: a sequence of length {longest} is longer than max_length {max_length}; truncate it first"
        )
    return torch.ops.fbgemm.jagged_to_padded_dense(values, [_offsets(lengths)], [max_length], 0.0)


def to_jagged(padded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, L, D] with lengths [B] -> the [sum(lengths), D] rows of the real positions."""
    if padded.dim() != 3 or padded.shape[0] != lengths.numel():
        raise ValueError(
            f"to_jagged: expected a padded tensor of shape (B = {lengths.numel()}, L, D), got {tuple(padded.shape)}"
        )
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > padded.shape[1]:
        raise ValueError(f"to_jagged: a sequence of length {longest} does not fit in {padded.shape[1]} positions")
    total = int(lengths.sum())
    return torch.ops.fbgemm.dense_to_jagged(padded, [_offsets(lengths)], total)[0]


def truncate(sequence: JaggedTensor, max_length: int, keep: str = "end") -> JaggedTensor:
    """Cuts every sequence to at most `max_length` positions, keeping its `end` or `start`.

    Works on ids ([sum(L)]) and embeddings ([sum(L), D]); weights are cut alike.
    """
    _check_max_length("truncate", max_length)
    if keep not in KEEP_SIDES:
        raise ValueError(f"truncate: keep must be 'end' or 'start' (got {keep!r})")
    lengths = sequence.lengths()
    kept = lengths.clamp(max=max_length)
    offsets = sequence.offsets()
    first = offsets[1:] - kept if keep == "end" else offsets[:-1]
    total = int(kept.sum())
    new_offsets = _offsets(kept)
    starts = first - new_offsets[:-1]
    index = torch.arange(total, device=lengths.device) + starts.repeat_interleave(kept, output_size=total)
    weights = sequence.weights_or_none()
    return JaggedTensor(
        sequence.values().index_select(0, index),
        None if weights is None else weights.index_select(0, index),
        lengths=kept,
        offsets=new_offsets,
    )


def truncate_keyed(features: KeyedJaggedTensor, limits: Mapping[str, tuple[int, str]]) -> KeyedJaggedTensor:
    """Cuts the bags of the keys in `limits` ({key: (max_length, keep)}) as `truncate` does.

    Other keys pass unchanged, and so does the whole batch, uncopied, when no
    bag is longer than its key's limit. Keys of `limits` absent from the
    batch are ignored.
    """
    keys, stride = features.keys(), features.stride()
    lengths = features.lengths()
    caps, ends = [], []
    for key in keys:
        max_length, keep = limits.get(key, (None, "end"))
        if max_length is not None:
            _check_max_length(f"truncate_keyed: key {key!r}", max_length)
        if keep not in KEEP_SIDES:
            raise ValueError(f"truncate_keyed: key {key!r}: keep must be 'end' or 'start' (got {keep!r})")
        caps.append(-1 if max_length is None else max_length)
        ends.append(keep == "end")
    cap = torch.tensor(caps, dtype=lengths.dtype, device=lengths.device).repeat_interleave(stride)
    cap = torch.where(cap < 0, lengths, cap)
    kept = torch.minimum(lengths, cap)
    if torch.equal(kept, lengths):
        return features
    end = torch.tensor(ends, device=lengths.device).repeat_interleave(stride)
    offsets = _offsets(lengths)
    first = torch.where(end, offsets[1:] - kept, offsets[:-1])
    new_offsets = _offsets(kept)
    total = int(new_offsets[-1])
    index = torch.arange(total, device=lengths.device) + (first - new_offsets[:-1]).repeat_interleave(
        kept, output_size=total
    )
    weights = features.weights_or_none()
    return KeyedJaggedTensor(
        keys,
        features.values().index_select(0, index),
        None if weights is None else weights.index_select(0, index),
        lengths=kept,
        stride=stride,
    )


def pool_rows(rows: JaggedTensor, mode: str, weights: torch.Tensor | None = None) -> torch.Tensor:
    """[sum(L), D] rows with lengths [B] -> [B, D]: their sum or mean per sample, each row times its weight.

    A bag's pooled embedding, from the rows a sequence table looked up: the
    mean divides the (weighted) sum by the bag's id count, as the bag kernels
    do; an empty bag gives zeros.
    """
    if mode not in ROW_POOLING:
        raise ValueError(f"pool_rows: mode must be 'sum' or 'mean' (got {mode!r})")
    values, lengths = rows.values(), rows.lengths().long()
    if weights is not None:
        values = values * weights.unsqueeze(1).to(values.dtype)
    batch = lengths.numel()
    sample = torch.arange(batch, device=values.device).repeat_interleave(lengths, output_size=values.shape[0])
    pooled = values.new_zeros(batch, values.shape[1]).index_add(0, sample, values)
    if mode == "mean":
        pooled = pooled / lengths.clamp(min=1).unsqueeze(1).to(values.dtype)
    return pooled


def pad_times(times: JaggedTensor, max_length: int, sequence_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """A timestamps key [sum(L)] with lengths [B] -> [B, max_length] int64, zeros after each sequence.

    With `sequence_lengths`, the lengths of the ids the times belong to, a sample whose times are
    more or fewer than its ids is refused (the readers refuse such a row; a batch built by hand
    would otherwise pair times with the wrong ids and still give a loss)."""
    _check_max_length("pad_times", max_length)
    lengths = times.lengths()
    if sequence_lengths is not None:
        _check_same_lengths(lengths, sequence_lengths)
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > max_length:
        raise ValueError(
            f"pad_times: a sequence of length {longest} is longer than max_length {max_length}; truncate it first"
        )
    padded = torch.zeros(lengths.numel(), max_length, dtype=torch.int64, device=lengths.device)
    padded[padding_mask(lengths, max_length)] = times.values().to(torch.int64)
    return padded


def _check_same_lengths(times: torch.Tensor, ids: torch.Tensor) -> None:
    if times.shape != ids.shape:
        raise ValueError(f"pad_times: timestamps for {times.numel()} samples but their sequence has {ids.numel()}")
    differ = times.ne(ids.to(times.dtype))
    if bool(differ.any()):
        sample = int(differ.nonzero()[0, 0])
        raise ValueError(
            f"pad_times: sample {sample} has {int(times[sample])} timestamps but {int(ids[sample])} ids in its "
            "sequence; each id needs its time"
        )
