"""Jagged tensors: the sparse-feature containers every runtime stage passes along.

`KeyedJaggedTensor` carries a batch of variable-length id lists for many
features (what the data readers yield and `input_dist` and the embedding
lookups consume), `JaggedTensor` is one feature of it, and `KeyedTensor`
carries the pooled embeddings that come back (what the dense blocks take).
Names and semantics follow TorchRec's `torchrec.sparse.jagged_tensor`.

Layout of a KeyedJaggedTensor with K keys and batch size B (its stride): the
values of each key are one contiguous block, batch-major inside it, and
`lengths` holds K * B counts, key-major. Derived data (offsets,
length_per_key, offset_per_key) is computed lazily and cached:
`length_per_key` costs the one device-to-host sync of an object, and what
`split`, `permute`, `concat` and `to` return inherits it instead of syncing
again.

The classes are torch pytree nodes, and constructing one from fx Proxies
records a graph node, so they can be inputs, outputs and intermediate values
of fx GraphModules and `torch.export` programs.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Callable, Protocol

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch
from torch.utils import _pytree as pytree

from runtime.sparse import validation as checks

__all__ = ["ColumnPieces", "JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"]


class _Traceable(torch.fx.ProxyableClassMeta):
    """Makes construction from fx Proxies a graph node, as its base does.

    The base asks `is_fx_tracing()`, which logs a warning about torch.export
    in every process on the first construction; looking for a Proxy argument
    directly needs no such question.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        for arg in itertools.chain(args, kwargs.values()):
            if isinstance(arg, torch.fx.Proxy):
                return arg.tracer.create_proxy("call_function", cls, args, kwargs)
        return type.__call__(cls, *args, **kwargs)


def _offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)


def _lengths_from_offsets(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


def _cumsum(counts: list[int]) -> list[int]:
    return list(itertools.accumulate(counts, initial=0))


def _map_optional(tensor: torch.Tensor | None, fn: Callable[[torch.Tensor], Any]) -> Any:
    return None if tensor is None else fn(tensor)


def _bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.element_size() * t.numel() for t in tensors if t is not None)


class JaggedTensor(metaclass=_Traceable):
    """One feature of a batch: sample b owns values[offsets[b]:offsets[b + 1]].

    Give `lengths` or `offsets` (or both); the other is derived lazily.
    `values` may have trailing dimensions (e.g. sequence embeddings).
    """

    def __init__(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        validate: bool = False,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("JaggedTensor: needs lengths or offsets")
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets
        if validate:
            self.validate()

    @staticmethod
    def from_dense(values: list[torch.Tensor], weights: list[torch.Tensor] | None = None) -> JaggedTensor:
        """Builds a JaggedTensor from one tensor per sample."""
        if not values:
            raise ValueError("JaggedTensor.from_dense: needs at least one sample to know the dtype")
        if weights is not None and len(weights) != len(values):
            raise ValueError(f"JaggedTensor.from_dense: {len(weights)} weight tensors for {len(values)} samples")
        flat = torch.cat(values)
        lengths = torch.tensor([v.size(0) for v in values], dtype=torch.int32, device=flat.device)
        return JaggedTensor(flat, None if weights is None else torch.cat(weights), lengths)

    @staticmethod
    def from_dense_lengths(
        values: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None = None
    ) -> JaggedTensor:
        """Sample b's first lengths[b] entries of row b of `values` (B x N), and of `weights`."""
        if values.dim() < 2 or lengths.shape != values.shape[:1]:
            raise ValueError(
                f"JaggedTensor.from_dense_lengths: values of shape {tuple(values.shape)} need lengths of "
                f"shape ({values.shape[0] if values.dim() else 0},), got {tuple(lengths.shape)}"
            )
        if weights is not None and weights.shape[:2] != values.shape[:2]:
            raise ValueError(
                f"JaggedTensor.from_dense_lengths: weights of shape {tuple(weights.shape)} for values of "
                f"shape {tuple(values.shape)}"
            )
        mask = torch.arange(values.size(1), device=values.device).expand(values.size(0), -1) < lengths.unsqueeze(-1)
        return JaggedTensor(values[mask], _map_optional(weights, lambda w: w[mask]), lengths)

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> JaggedTensor:
        """No samples: empty values (and weights if `is_weighted`), lengths [] and offsets [0]."""
        return JaggedTensor(
            torch.empty(0, dtype=values_dtype, device=device),
            torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            offsets=torch.zeros(1, dtype=lengths_dtype, device=device),
        )

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError("JaggedTensor has no weights; use weights_or_none()")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            self._lengths = _lengths_from_offsets(self._offsets)
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = _offsets_from_lengths(self._lengths)
        return self._offsets

    def lengths_or_none(self) -> torch.Tensor | None:
        """The lengths if given or computed already, else None (nothing computed)."""
        return self._lengths

    def offsets_or_none(self) -> torch.Tensor | None:
        """The offsets if given or computed already, else None (nothing computed)."""
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def size_in_bytes(self) -> int:
        """Bytes of the values, weights, and the lengths and offsets held (given or computed)."""
        return _bytes(self._values, self._weights, self._lengths, self._offsets)

    def to_dense(self) -> list[torch.Tensor]:
        """One tensor per sample (views into values)."""
        return self._per_sample(self._values)

    def to_dense_weights(self) -> list[torch.Tensor] | None:
        """One tensor of weights per sample (views), or None without weights."""
        return _map_optional(self._weights, self._per_sample)

    def to_padded_dense(self, desired_length: int | None = None, padding_value: float = 0.0) -> torch.Tensor:
        """B x N tensor, N = desired_length or the longest sample; longer samples are cut."""
        return self._padded(self._values, desired_length, padding_value)

    def to_padded_dense_weights(
        self, desired_length: int | None = None, padding_value: float = 0.0
    ) -> torch.Tensor | None:
        """The weights as `to_padded_dense` lays out the values, or None without weights."""
        return _map_optional(self._weights, lambda w: self._padded(w, desired_length, padding_value))

    def _per_sample(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(tensor, self.lengths().tolist())) if self.lengths().numel() else []

    def _padded(self, tensor: torch.Tensor, desired_length: int | None, padding_value: float) -> torch.Tensor:
        if desired_length is None:
            lengths = self.lengths()
            desired_length = int(lengths.max()) if lengths.numel() else 0
        return torch.ops.fbgemm.jagged_to_padded_dense(tensor, [self.offsets()], [desired_length], padding_value)

    def validate(self) -> JaggedTensor:
        """Checks the layout (syncs with the device); returns self."""
        lengths, offsets = self._lengths, self._offsets
        samples = lengths.numel() if lengths is not None else max(offsets.numel() - 1, 0)
        tensors = {"values": self._values, "weights": self._weights}
        tensors |= {"lengths": lengths, "offsets": offsets}
        checks.check_layout("JaggedTensor", tensors, samples)
        return self

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> JaggedTensor:
        return JaggedTensor(
            fn(self._values),
            _map_optional(self._weights, fn),
            _map_optional(self._lengths, fn),
            _map_optional(self._offsets, fn),
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> JaggedTensor:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> JaggedTensor:
        return self._map(torch.Tensor.pin_memory)

    def __repr__(self) -> str:
        values = self._values
        weighted = self._weights is not None
        return f"JaggedTensor({values.dtype}{list(values.shape)}, weighted={weighted})"


class KeyedJaggedTensor(metaclass=_Traceable):
    """A batch of jagged features, one block of values per key (see the module docstring).

    `stride` is the batch size: inferred from lengths or offsets unless given,
    and 0 for zero keys unless given. `length_per_key` and `offset_per_key`
    are caches a caller may pass when it already knows them.
    """

    def __init__(
        self,
        keys: list[str],
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        stride: int | None = None,
        length_per_key: list[int] | None = None,
        offset_per_key: list[int] | None = None,
        validate: bool = False,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("KeyedJaggedTensor: needs lengths or offsets")
        self._keys = list(keys)
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets
        if stride is None:
            entries = lengths.numel() if lengths is not None else max(offsets.numel() - 1, 0)
            stride = entries // len(self._keys) if self._keys else 0
        self._stride = stride
        self._length_per_key = length_per_key
        self._offset_per_key = offset_per_key
        self._index_per_key: dict[str, int] | None = None
        if validate:
            self.validate()

    @staticmethod
    def from_lengths_sync(
        keys: list[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
        validate: bool = False,
    ) -> KeyedJaggedTensor:
        """Builds from lengths and computes length/offset_per_key now (one sync)."""
        return KeyedJaggedTensor(keys, values, weights, lengths=lengths, stride=stride, validate=validate).sync()

    @staticmethod
    def from_offsets_sync(
        keys: list[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
        validate: bool = False,
    ) -> KeyedJaggedTensor:
        """Builds from offsets and computes length/offset_per_key now (one sync)."""
        return KeyedJaggedTensor(keys, values, weights, offsets=offsets, stride=stride, validate=validate).sync()

    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: torch.device | None = None,
        values_dtype: torch.dtype | None = None,
        weights_dtype: torch.dtype | None = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> KeyedJaggedTensor:
        """No keys and stride 0: empty values (and weights if `is_weighted`) and lengths."""
        return KeyedJaggedTensor(
            [],
            torch.empty(0, dtype=values_dtype, device=device),
            torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            stride=0,
        )

    @staticmethod
    def from_jt_dict(jt_dict: dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        """The keys of `jt_dict` in its order, each its JaggedTensor's samples (synced).

        Every JaggedTensor must hold the same number of samples (one batch), and all or none weights.
        """
        if not jt_dict:
            raise ValueError("KeyedJaggedTensor.from_jt_dict: needs at least one JaggedTensor")
        keys, jts = list(jt_dict), list(jt_dict.values())
        stride = jts[0].lengths().numel()
        for key, jt in zip(keys, jts):
            if jt.lengths().numel() != stride:
                raise ValueError(
                    f"KeyedJaggedTensor.from_jt_dict: key {key!r} has {jt.lengths().numel()} samples but "
                    f"key {keys[0]!r} has {stride} (variable batch sizes per key are not supported)"
                )
            if (jt.weights_or_none() is None) != (jts[0].weights_or_none() is None):
                raise ValueError(
                    f"KeyedJaggedTensor.from_jt_dict: key {key!r} and key {keys[0]!r} disagree on weights "
                    "(all JaggedTensors need weights, or none)"
                )
        weighted = jts[0].weights_or_none() is not None
        return KeyedJaggedTensor.from_lengths_sync(
            keys,
            torch.cat([jt.values() for jt in jts]),
            torch.cat([jt.lengths() for jt in jts]),
            torch.cat([jt.weights() for jt in jts]) if weighted else None,
            stride=stride,
        )

    @staticmethod
    def empty_like(kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """No keys, but the stride, device and dtypes of `kjt` (a rank with no features)."""
        return KeyedJaggedTensor(
            [],
            kjt.values().new_empty(0),
            _map_optional(kjt.weights_or_none(), lambda w: w.new_empty(0)),
            lengths=kjt.lengths().new_empty(0),
            stride=kjt.stride(),
        )

    @staticmethod
    def concat(kjts: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
        """Concatenates the keys of batches that share a stride."""
        if not kjts:
            raise ValueError("KeyedJaggedTensor.concat: needs at least one KeyedJaggedTensor")
        stride, weighted = kjts[0].stride(), kjts[0].weights_or_none() is not None
        for i, kjt in enumerate(kjts):
            if kjt.stride() != stride:
                raise ValueError(
                    f"KeyedJaggedTensor.concat: input {i} has stride {kjt.stride()} but input 0 has stride {stride}"
                )
            if (kjt.weights_or_none() is not None) != weighted:
                has = "has" if weighted else "has no"
                raise ValueError(f"KeyedJaggedTensor.concat: input 0 {has} weights, input {i} not")
        cached = [kjt._length_per_key for kjt in kjts]
        return KeyedJaggedTensor(
            [key for kjt in kjts for key in kjt.keys()],
            torch.cat([kjt.values() for kjt in kjts]),
            torch.cat([kjt.weights() for kjt in kjts]) if weighted else None,
            lengths=torch.cat([kjt.lengths() for kjt in kjts]),
            stride=stride,
            length_per_key=None if None in cached else [n for lpk in cached for n in lpk],
        )

    def sync(self) -> KeyedJaggedTensor:
        """Computes length_per_key and offset_per_key now; returns self."""
        self.offset_per_key()
        return self

    def unsync(self) -> KeyedJaggedTensor:
        """Forgets length_per_key and offset_per_key (the next use computes them again); returns self."""
        self._length_per_key = self._offset_per_key = None
        return self

    def size_in_bytes(self) -> int:
        """Bytes of the values, weights, and the lengths and offsets held (given or computed)."""
        return _bytes(self._values, self._weights, self._lengths, self._offsets)

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError("KeyedJaggedTensor has no weights; use weights_or_none()")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            self._lengths = _lengths_from_offsets(self._offsets)
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = _offsets_from_lengths(self._lengths)
        return self._offsets

    def lengths_or_none(self) -> torch.Tensor | None:
        """The lengths if given or computed already, else None (nothing computed)."""
        return self._lengths

    def offsets_or_none(self) -> torch.Tensor | None:
        """The offsets if given or computed already, else None (nothing computed)."""
        return self._offsets

    def length_per_key_or_none(self) -> list[int] | None:
        """The per-key value counts if known already, else None (no sync)."""
        return self._length_per_key

    def offset_per_key_or_none(self) -> list[int] | None:
        """Where each key's values start if known already, else None (no sync)."""
        return self._offset_per_key

    def stride(self) -> int:
        """The batch size."""
        return self._stride

    def stride_per_key(self) -> list[int]:
        """The batch size of each key: the stride for every key (one batch size for all keys)."""
        return [self._stride] * len(self._keys)

    def inverse_indices_or_none(self) -> tuple[list[str], torch.Tensor] | None:
        """None: no batch here carries inverse indices (they come with variable batch sizes per key)."""
        return None

    def device(self) -> torch.device:
        return self._values.device

    def index_per_key(self) -> dict[str, int]:
        if self._index_per_key is None:
            self._index_per_key = {key: i for i, key in enumerate(self._keys)}
        return self._index_per_key

    def length_per_key(self) -> list[int]:
        """Number of values of each key; the first call syncs with the device."""
        if self._length_per_key is None:
            keys, stride = len(self._keys), self._stride
            if keys == 0 or stride == 0:
                self._length_per_key = [0] * keys
            elif self._lengths is not None:
                self._length_per_key = self._lengths.view(keys, stride).sum(dim=1).tolist()
            else:
                # Every `stride`-th offset is a key boundary: offset_per_key comes for free.
                self._offset_per_key = self._offsets[::stride].tolist()
                pairs = itertools.pairwise(self._offset_per_key)
                self._length_per_key = [end - start for start, end in pairs]
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """Where each key's block starts in values, plus the total at the end."""
        if self._offset_per_key is None:
            self._offset_per_key = _cumsum(self.length_per_key())
        return self._offset_per_key

    def __getitem__(self, key: str) -> JaggedTensor:
        index = self.index_per_key().get(key)
        if index is None:
            raise KeyError(f"KeyedJaggedTensor has no key {key!r}; keys are {self._keys}")
        start, end = self.offset_per_key()[index : index + 2]
        return JaggedTensor(
            self._values[start:end],
            _map_optional(self._weights, lambda w: w[start:end]),
            self.lengths()[index * self._stride : (index + 1) * self._stride],
        )

    def to_dict(self) -> dict[str, JaggedTensor]:
        if not self._keys:
            return {}
        length_per_key = self.length_per_key()
        values = torch.split(self._values, length_per_key)
        weights = [None] * len(self._keys)
        if self._weights is not None:
            weights = torch.split(self._weights, length_per_key)
        lengths = self.lengths().view(len(self._keys), self._stride)
        return {key: JaggedTensor(v, w, lengths[i]) for i, (key, v, w) in enumerate(zip(self._keys, values, weights))}

    def split(self, segments: list[int]) -> list[KeyedJaggedTensor]:
        """Splits the keys into consecutive groups of the given sizes (views, no copy)."""
        if any(n < 0 for n in segments) or sum(segments) != len(self._keys):
            raise ValueError(
                f"KeyedJaggedTensor.split: segments {list(segments)} do not add up to the {len(self._keys)} keys"
            )
        offset_per_key = self.offset_per_key()
        lengths, stride = self.lengths(), self._stride
        parts = []
        for start, end in itertools.pairwise(_cumsum(segments)):
            first, last = offset_per_key[start], offset_per_key[end]
            parts.append(
                KeyedJaggedTensor(
                    self._keys[start:end],
                    self._values[first:last],
                    _map_optional(self._weights, lambda w: w[first:last]),
                    lengths[start * stride : end * stride],
                    stride=stride,
                    length_per_key=self._length_per_key[start:end],
                    offset_per_key=[o - first for o in offset_per_key[start : end + 1]],
                )
            )
        return parts

    def permute(self, indices: list[int], indices_tensor: torch.Tensor | None = None) -> KeyedJaggedTensor:
        """Key i of the result is key indices[i] of this batch; keys may repeat or drop out.

        `indices_tensor` is `indices` already on the device, to save a copy per step.
        """
        for i in indices:
            if not 0 <= i < len(self._keys):
                raise ValueError(f"KeyedJaggedTensor.permute: index {i} out of range for {len(self._keys)} keys")
        length_per_key = self.length_per_key()
        permuted_lpk = [length_per_key[i] for i in indices]
        if indices_tensor is None:
            indices_tensor = torch.tensor(indices, dtype=torch.int32, device=self.device())
        # fbgemm's backward inverts the permutation, which a repeated or dropped key does not have
        # (it then reads out of bounds): weights that need a gradient are gathered by index instead.
        gathered = self._weights is not None and self._weights.requires_grad and torch.is_grad_enabled()
        # The output size passed in spares the kernel a sync; it must be right.
        lengths, values, weights = torch.ops.fbgemm.permute_2D_sparse_data(
            indices_tensor.to(torch.int32),
            self.lengths().view(len(self._keys), self._stride),
            self._values,
            None if gathered else self._weights,
            sum(permuted_lpk),
        )
        if gathered:
            starts = self.offset_per_key()
            positions = [torch.arange(starts[i], starts[i + 1], device=self.device()) for i in indices]
            weights = self._weights.index_select(0, torch.cat(positions) if positions else values.new_zeros(0))
        return KeyedJaggedTensor(
            [self._keys[i] for i in indices],
            values,
            weights,
            lengths.view(-1),
            stride=self._stride,
            length_per_key=permuted_lpk,
        )

    def validate(self) -> KeyedJaggedTensor:
        """Checks the layout and the caches passed in (syncs with the device); returns self.

        Run it on untrusted input: the fbgemm kernels trust the layout and
        read or write out of bounds when lengths, values and caches disagree.
        """
        owner, keys, stride = "KeyedJaggedTensor", self._keys, self._stride
        checks.check_keys(owner, keys)
        if stride < 0:
            raise ValueError(f"{owner}: stride must be >= 0, got {stride}")
        if self._values.dim() != 1:
            raise ValueError(f"{owner}: values must be 1-D, got shape {tuple(self._values.shape)}")
        if self._values.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{owner}: values must be int32 or int64 ids, got {self._values.dtype}")
        tensors = {"values": self._values, "weights": self._weights}
        tensors |= {"lengths": self._lengths, "offsets": self._offsets}
        checks.check_layout(owner, tensors, stride, keys)
        claimed_lengths, claimed_offsets = self._length_per_key, self._offset_per_key
        self._length_per_key = self._offset_per_key = None
        checks.check_per_key_caches(
            self.keys(), self.length_per_key(), self.offset_per_key(), claimed_lengths, claimed_offsets
        )
        return self

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> KeyedJaggedTensor:
        kjt = KeyedJaggedTensor(
            self._keys,
            fn(self._values),
            _map_optional(self._weights, fn),
            _map_optional(self._lengths, fn),
            _map_optional(self._offsets, fn),
            stride=self._stride,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
        )
        kjt._index_per_key = self._index_per_key
        return kjt

    def to(self, device: torch.device | str, non_blocking: bool = False) -> KeyedJaggedTensor:
        """Copies the tensors to `device`; the cached per-key lists carry over."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> KeyedJaggedTensor:
        return self._map(torch.Tensor.pin_memory)

    def record_stream(self, stream: torch.Stream) -> None:
        """Marks the tensors as used by `stream`, for a copy made on a side stream."""
        for tensor in (self._values, self._weights, self._lengths, self._offsets):
            if tensor is not None:
                tensor.record_stream(stream)

    def __repr__(self) -> str:
        values = self._values
        return (
            f"KeyedJaggedTensor(keys={self._keys}, stride={self._stride}, "
            f"values={values.dtype}{list(values.shape)}, weighted={self._weights is not None})"
        )


class ColumnPieces(Protocol):
    """A KeyedTensor's B x W values before they are placed side by side: pieces of one 1-D buffer.

    Each piece is a (B, w) view whose rows are each one run of values; in
    column order the pieces make up the values, and together they cover
    every element of the buffer once. What a pooled all-to-all receives is
    such a buffer (runtime/sharding/pooled_dist.py); a consumer that reads
    the pieces where they lie (runtime/modules/blocks/pooled.py's DotInteraction)
    saves the copy into one tensor and the copy of its gradient back.
    """

    buffer: torch.Tensor
    widths: tuple[int, ...]  # the pieces' widths (w), in column order

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """The pieces of `buffer` (this one, or one of its size: a gradient), in column order."""

    def place(self) -> torch.Tensor:
        """The B x W values in one tensor, differentiable with respect to the buffer."""


class KeyedTensor(metaclass=_Traceable):
    """Dense per-key blocks side by side: values is B x sum(length_per_key).

    The usual content is the pooled embeddings of an EmbeddingBagCollection.
    Keys are always along dimension 1 (TorchRec's default key_dim). The values
    may come as `ColumnPieces`, or as a tuple of (B, w) tensors side by side in
    column order (a collection's table groups, each pooled by a kernel of its
    own), placed in one tensor on the first `values()`: a consumer that reads
    `pieces()` or `parts()` where they lie saves that copy.
    """

    def __init__(
        self,
        keys: list[str],
        length_per_key: list[int],
        values: torch.Tensor | ColumnPieces | tuple[torch.Tensor, ...],
    ) -> None:
        self._keys = list(keys)
        self._length_per_key = list(length_per_key)
        self._parts = values if isinstance(values, tuple) else None
        self._pieces = None if isinstance(values, (torch.Tensor, tuple)) else values
        self._values = values if isinstance(values, torch.Tensor) else None
        self._offset_per_key: list[int] | None = None
        self._index_per_key: dict[str, int] | None = None

    @staticmethod
    def from_tensor_list(keys: list[str], tensors: list[torch.Tensor]) -> KeyedTensor:
        """Puts B x d_k tensors, one per key, side by side."""
        return KeyedTensor(keys, [t.size(1) for t in tensors], torch.cat(tensors, dim=1))

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        if self._values is None:
            self._values = torch.cat(self._parts, dim=1) if self._parts is not None else self._pieces.place()
        return self._values

    def pieces(self) -> ColumnPieces | None:
        """Where the values lie in pieces of one buffer, if they came so; else None."""
        return self._pieces

    def parts(self) -> tuple[torch.Tensor, ...] | None:
        """The (B, w) tensors side by side that make up the values, if they came so; else None."""
        return self._parts

    def length_per_key(self) -> list[int]:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        if self._offset_per_key is None:
            self._offset_per_key = _cumsum(self._length_per_key)
        return self._offset_per_key

    def key_dim(self) -> int:
        return 1

    def device(self) -> torch.device:
        if self._values is not None:
            return self._values.device
        return self._parts[0].device if self._parts is not None else self._pieces.buffer.device

    def __getitem__(self, key: str) -> torch.Tensor:
        if self._index_per_key is None:
            self._index_per_key = {k: i for i, k in enumerate(self._keys)}
        index = self._index_per_key.get(key)
        if index is None:
            raise KeyError(f"KeyedTensor has no key {key!r}; keys are {self._keys}")
        return self.values().narrow(1, self.offset_per_key()[index], self._length_per_key[index])

    def to_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self._keys, torch.split(self.values(), self._length_per_key, dim=1)))

    def size_in_bytes(self) -> int:
        """Bytes of the values."""
        return _bytes(self.values())

    @staticmethod
    def regroup_as_dict(
        keyed_tensors: list[KeyedTensor], groups: list[list[str]], keys: list[str]
    ) -> dict[str, torch.Tensor]:
        """`regroup`'s tensors by name: keys[i] names the tensor of groups[i]."""
        if len(groups) != len(keys):
            raise ValueError(f"KeyedTensor.regroup_as_dict: {len(groups)} groups but {len(keys)} keys to name them")
        return dict(zip(keys, KeyedTensor.regroup(keyed_tensors, groups)))

    @staticmethod
    def regroup(keyed_tensors: list[KeyedTensor], groups: list[list[str]]) -> list[torch.Tensor]:
        """One tensor per group: the columns of its keys side by side, in group order.

        A key may appear in several groups; gradients flow back to every use.
        Where inputs share a key, the first input's columns are used.
        """
        columns: dict[str, torch.Tensor] = {}
        for i, kt in enumerate(keyed_tensors):
            if kt.values().size(0) != keyed_tensors[0].values().size(0):
                raise ValueError(
                    f"KeyedTensor.regroup: input {i} has batch size {kt.values().size(0)} "
                    f"but input 0 has {keyed_tensors[0].values().size(0)}"
                )
            for key, block in kt.to_dict().items():
                columns.setdefault(key, block)
        out = []
        for g, group in enumerate(groups):
            missing = [key for key in group if key not in columns]
            if missing or not group:
                what = f"key {missing[0]!r} is in no input" if missing else "it is empty"
                raise ValueError(f"KeyedTensor.regroup: group {g}: {what}")
            out.append(torch.cat([columns[key] for key in group], dim=1))
        return out

    def validate(self) -> KeyedTensor:
        """Checks keys, length_per_key and the shape of values; returns self."""
        checks.check_keyed_tensor(self._keys, self._length_per_key, self.values())
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> KeyedTensor:
        values = self.values().to(device, non_blocking=non_blocking)
        return KeyedTensor(self._keys, self._length_per_key, values)

    def record_stream(self, stream: torch.Stream) -> None:
        self.values().record_stream(stream)

    def __repr__(self) -> str:
        values = self.values()
        return (
            f"KeyedTensor(keys={self._keys}, length_per_key={self._length_per_key}, "
            f"values={values.dtype}{list(values.shape)})"
        )


# Pytree registration. Offsets are derived data, not a leaf, so a batch built
# from lengths and one built from offsets have the same tree spec (an exported
# program accepts both). A KJT's stride is context only when it has no keys:
# otherwise the batch size stays a property of the tensors, free to vary.


class KeySelection:
    """Picks the keys `wanted` (repeats allowed) of a KeyedJaggedTensor, in that order.

    One fbgemm permute; its indices are cached per incoming key order and
    device, and a batch already in the wanted order is returned as it is.
    """

    def __init__(self, wanted: list[str]) -> None:
        self.wanted = list(wanted)
        self._permutes: dict[tuple[tuple[str, ...], torch.device], tuple[list[int], torch.Tensor]] = {}

    def __call__(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        keys = features.keys()
        if keys == self.wanted:
            return features
        cache_key = (tuple(keys), features.device())
        if cache_key not in self._permutes:
            index = features.index_per_key()
            missing = [name for name in self.wanted if name not in index]
            if missing:
                raise ValueError(f"KeyedJaggedTensor has no feature {missing[0]!r} (keys: {keys})")
            indices = [index[name] for name in self.wanted]
            tensor = torch.tensor(indices, dtype=torch.int32, device=features.device())
            self._permutes[cache_key] = (indices, tensor)
        return features.permute(*self._permutes[cache_key])


def _jt_flatten_with_keys(jt: JaggedTensor) -> tuple[list, None]:
    leaves = {"_values": jt.values(), "_weights": jt.weights_or_none(), "_lengths": jt.lengths()}
    return [(pytree.GetAttrKey(name), leaf) for name, leaf in leaves.items()], None


def _kjt_flatten_with_keys(kjt: KeyedJaggedTensor) -> tuple[list, tuple]:
    leaves = {"_values": kjt.values(), "_weights": kjt.weights_or_none()}
    leaves["_lengths"] = kjt.lengths()
    context = (tuple(kjt.keys()), None if kjt.keys() else kjt.stride())
    return [(pytree.GetAttrKey(name), leaf) for name, leaf in leaves.items()], context


def _kjt_unflatten(leaves: list, context: tuple) -> KeyedJaggedTensor:
    values, weights, lengths = leaves
    keys, stride = context
    return KeyedJaggedTensor(list(keys), values, weights, lengths, stride=stride)


def _kt_flatten_with_keys(kt: KeyedTensor) -> tuple[list, tuple]:
    context = (tuple(kt.keys()), tuple(kt.length_per_key()))
    return [(pytree.GetAttrKey("_values"), kt.values())], context


def _register(
    cls: type,
    flatten_with_keys: Callable[[Any], tuple[list, Any]],
    unflatten: Callable[[list, Any], Any],
    context_from_json: Callable[[Any], Any],
) -> None:
    def flatten(obj: Any) -> tuple[list, Any]:
        entries, context = flatten_with_keys(obj)
        return [leaf for _, leaf in entries], context

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{__name__}.{cls.__name__}",
        to_dumpable_context=json.dumps,
        from_dumpable_context=lambda text: context_from_json(json.loads(text)),
        flatten_with_keys_fn=flatten_with_keys,
    )


_register(JaggedTensor, _jt_flatten_with_keys, lambda leaves, _: JaggedTensor(*leaves), lambda _: None)
_register(KeyedJaggedTensor, _kjt_flatten_with_keys, _kjt_unflatten, lambda c: (tuple(c[0]), c[1]))
_register(
    KeyedTensor,
    _kt_flatten_with_keys,
    lambda leaves, context: KeyedTensor(list(context[0]), list(context[1]), *leaves),
    lambda c: (tuple(c[0]), tuple(c[1])),
)
