"""The shape check's stand-ins for sequences: groups, graph-edge functions and the sequence blocks.

Used by `compiler.lowering.shapes`. The sequence blocks and the padding
functions read their lengths' values (to check and to pad), which meta
tensors do not have; here each gives its output shape from its input shapes
instead, after checking what the module's own forward would check, so the
shape check still says which block does not fit.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from runtime.modules.blocks.gru import GRU
from runtime.modules.blocks.hstu import HSTU
from runtime.modules.blocks.sequence_pool import SequencePool
from runtime.modules.blocks.target_attention import TargetAttention
from runtime.modules.blocks.transformer import Transformer
from runtime.modules.layers.position_weights import PositionWeightedPool
from runtime.sparse.sequence import pad_times, pool_rows, to_padded


class SequenceShapeError(Exception):
    """A sequence block's inputs do not fit it; the message says how."""


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


META_FUNCTIONS: dict[Callable[..., Any], Callable[..., torch.Tensor]] = {
    to_padded: lambda values, lengths, length: _meta(lengths.shape[0], length, values.shape[1]),
    pool_rows: lambda rows, mode, weights=None: _meta(rows.lengths().shape[0], rows.values().shape[1]),
    pad_times: lambda times, length, lengths=None: _meta(times.lengths().shape[0], length, dtype=torch.int64),
}


def _sequence(owner: str, x: torch.Tensor, dim: int, max_length: int = 0) -> None:
    if x.dim() != 3 or x.shape[2] != dim:
        raise SequenceShapeError(f"{owner} takes a sequence [B, L, {dim}] but its input is {list(x.shape[1:])} wide")
    if max_length and x.shape[1] > max_length:
        raise SequenceShapeError(f"{owner} takes at most {max_length} positions but its input has {x.shape[1]}")


def meta_forward(module: torch.nn.Module, args: tuple[Any, ...]) -> torch.Tensor | None:
    """The output of a sequence block (or a position-weighted pool) on meta inputs, or None for any other module."""
    if isinstance(module, SequencePool):
        _sequence("sequence_pool", args[0], module.dim)
        return _meta(args[0].shape[0], module.dim)
    if isinstance(module, TargetAttention):
        query, keys = args[0], args[1]
        _sequence("target_attention", keys, module.dim)
        if query.shape[1:] != (module.dim,):
            raise SequenceShapeError(f"target_attention takes a query {module.dim} wide, got {query.shape[1]}")
        return _meta(keys.shape[0], module.dim)
    if isinstance(module, Transformer):
        _sequence("transformer", args[0], module.dim, module.max_length)
        batch, length = args[0].shape[:2]
        return _meta(batch, length, module.width) if module.output == "sequence" else _meta(batch, module.width)
    if isinstance(module, PositionWeightedPool):  # pools rows like pool_rows
        return _meta(args[0].lengths().shape[0], args[0].values().shape[1])
    if isinstance(module, GRU):
        _sequence("gru", args[0], module.dim)
        if module.query_dim and args[2].shape[1:] != (module.query_dim,):
            raise SequenceShapeError(f"gru takes a query {module.query_dim} wide, got {args[2].shape[1]}")
        return _meta(args[0].shape[0], args[0].shape[1], module.hidden_size)
    if isinstance(module, HSTU):
        _sequence("hstu", args[0], module.dim, module.max_length)
        return _meta(*args[0].shape)
    return None
