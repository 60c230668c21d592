"""C kernels of the runtime, compiled on first use with the machine's C compiler.

DLRM's pairwise dot interaction (dot_interaction.c), 3-5x faster on the CPU
than `torch.bmm` over the full Gram matrix, the pooled lookup of
quantized inference tables (quant_pool.c), which fbgemm runs on one thread,
the backward of a training lookup with row-wise Adagrad in place
(rowwise_adagrad.c), the attention of one query per sample over a padded sequence
(one_query_attention.c), where `torch.bmm` pays per-matrix overhead, and the
in-batch softmax loss with its gradient in one pass over row tiles (in_batch_softmax.c).
They are plain C with no torch headers, built on first use by build.py
(`$CC` with -O3 -march=native, cached per source, compiler and CPU).
Tensors cross by pointer through ctypes, which releases the GIL for the
call; the kernels split the batch over torch's intra-op threads (OpenMP).

Where they cannot be built or loaded, `library()` returns None after one
warning that names the cause (no compiler, the compiler's first error, or
the loader's), and the callers keep their torch implementations: same
results, slower.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.cpu.native import build

__all__ = [
    "QUANT_FP32",
    "QuantLayout",
    "TableLayout",
    "applies",
    "cache_dir",
    "dot_backward",
    "dot_forward",
    "in_batch_softmax",
    "library",
    "one_query_attention_backward",
    "one_query_attention_forward",
    "quant_pool",
    "rowwise_adagrad_backward",
    "source_tag",
]

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


def cache_dir() -> Path:
    """Where the built libraries are kept."""
    return build.cache_root() / "native"


@functools.cache
def source_tag(kernel: str) -> str:
    """A short hash of `kernel`.c, for kernel choices to name: a changed kernel is measured again."""
    return hashlib.sha256((Path(__file__).parent / f"{kernel}.c").read_bytes()).hexdigest()[:8]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel library, or None (with one warning naming the cause) if it cannot be had here."""
    outcome = build.status()
    if outcome.library is None:
        warnings.warn(
            f"reccompile: native kernels unavailable, using torch ops instead: {outcome.problem}", stacklevel=2
        )
        return None
    if outcome.note is not None:
        warnings.warn(f"reccompile: native kernels: {outcome.note}", stacklevel=2)
    lib = outcome.library
    lib.reccompile_dot_forward.argtypes = [_I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64]
    lib.reccompile_dot_backward.argtypes = [_I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64]
    lib.reccompile_dot_forward.restype = lib.reccompile_dot_backward.restype = ctypes.c_int
    lib.reccompile_quant_pool.argtypes = [_I64, _I64, *[_PTR] * 6, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64]
    lib.reccompile_quant_pool.restype = ctypes.c_int
    lib.reccompile_one_query_attention_forward.argtypes = [*[_I64] * 4, *[_PTR] * 5, _I64]
    lib.reccompile_one_query_attention_backward.argtypes = [*[_I64] * 4, *[_PTR] * 8, _I64]
    lib.reccompile_rowwise_adagrad_backward.argtypes = [
        _I64,
        _I64,
        _I64,
        *[_PTR] * 8,
        _I64,
        *[_PTR] * 4,
        ctypes.c_float,
        ctypes.c_float,
        _I64,
    ]
    lib.reccompile_rowwise_adagrad_backward.restype = ctypes.c_int
    lib.reccompile_in_batch_softmax.argtypes = [*[_I64] * 3, *[_PTR] * 8, ctypes.c_float, _I64]
    lib.reccompile_in_batch_softmax.restype = ctypes.c_int
    lib.reccompile_one_query_attention_forward.restype = None
    lib.reccompile_one_query_attention_backward.restype = None
    return lib


def applies(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = torch.float32) -> bool:
    """Whether the kernels can take these tensors: on the CPU, of `dtype` (None: any), outside tracing."""
    return (
        all(t.is_cpu and (dtype is None or t.dtype == dtype) for t in tensors)
        and not torch.compiler.is_compiling()
        and not torch.compiler.is_exporting()
        and library() is not None
    )


def _pointers(tensors: Sequence[torch.Tensor]) -> ctypes.Array:
    return (_PTR * len(tensors))(*(t.data_ptr() for t in tensors))


def _counts(parts: Sequence[torch.Tensor], dim: int) -> ctypes.Array:
    return (_I64 * len(parts))(*(p.shape[1] // dim for p in parts))


def _rows(parts: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], ctypes.Array]:
    """The 2-D parts as the kernels read them, each row one run of values (copied where not), and
    their row strides."""
    readable, strides = [], []
    for part in parts:
        row, column = part.stride()
        if column != 1 or row < part.shape[1]:
            part = part.contiguous()
            row = part.shape[1]
        readable.append(part)
        strides.append(row)
    return readable, (_I64 * len(strides))(*strides)


def _check(status: int, what: str) -> None:
    if status != 0:
        raise MemoryError(f"dot interaction {what}: the native kernel could not allocate its scratch space")


def dot_forward(parts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """[z_0, <z_i, z_j> for i < j] per row of the parts, (B, k_p * dim) float32 side by side.

    A part whose rows are each one run of values (a column slice of a wider
    buffer, say) is read where it lies; others are copied first.
    """
    lib = library()
    assert lib is not None, "dot_forward called where applies() is False"
    parts, strides = _rows(parts)
    batch = parts[0].shape[0]
    n = sum(p.shape[1] for p in parts) // dim
    out = torch.empty(batch, dim + n * (n - 1) // 2)
    status = lib.reccompile_dot_forward(
        batch,
        len(parts),
        _pointers(parts),
        _counts(parts, dim),
        strides,
        dim,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    _check(status, "forward")
    return out


def dot_backward(
    parts: Sequence[torch.Tensor], dim: int, grad_out: torch.Tensor, grads: Sequence[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """The gradient of `dot_forward(parts, dim)` for each part, given the output's.

    Written into `grads` when given (one per part, its shape, each row one run
    of values: views into the buffer the gradient is wanted in), else into new
    contiguous tensors. `grad_out` may have rows further apart than its width
    (a column slice, as runtime/modules/layers/padded_grad.py returns); other layouts
    are copied first.
    """
    lib = library()
    assert lib is not None, "dot_backward called where applies() is False"
    (grad_out,), _ = _rows([grad_out])
    parts, strides = _rows(parts)
    if grads is None:
        grads = [torch.empty(p.shape) for p in parts]
    written, grad_strides = _rows(grads)
    assert all(w is g and g.shape == p.shape for w, g, p in zip(written, grads, parts)), "grads must match the parts"
    status = lib.reccompile_dot_backward(
        parts[0].shape[0],
        len(parts),
        _pointers(parts),
        _counts(parts, dim),
        strides,
        dim,
        grad_out.data_ptr(),
        grad_out.stride(0),
        _pointers(grads),
        grad_strides,
        torch.get_num_threads(),
    )
    _check(status, "backward")
    return grads


def one_query_attention_forward(
    x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted [B, H, D], probabilities [B, H, L]) of queries [B, H, D] over the first
    counts[b] rows of x [B, L, D] (contiguous float32; counts int64, clamped to [1, L])."""
    lib = library()
    assert lib is not None, "one_query_attention_forward called where applies() is False"
    (batch, length, dim), heads = x.shape, query.shape[1]
    weighted, probs = torch.empty(batch, heads, dim), torch.empty(batch, heads, length)
    lib.reccompile_one_query_attention_forward(
        batch,
        length,
        heads,
        dim,
        x.data_ptr(),
        query.data_ptr(),
        counts.data_ptr(),
        weighted.data_ptr(),
        probs.data_ptr(),
        torch.get_num_threads(),
    )
    return weighted, probs


def one_query_attention_backward(
    x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients (of x, of the queries) of `one_query_attention_forward`, given the weighted
    output's (contiguous)."""
    lib = library()
    assert lib is not None, "one_query_attention_backward called where applies() is False"
    (batch, length, dim), heads = x.shape, query.shape[1]
    grad_x, grad_query = torch.empty_like(x), torch.empty_like(query)
    threads = torch.get_num_threads()
    scratch = torch.empty(threads, max(length, 1))  # a thread's row of score gradients
    lib.reccompile_one_query_attention_backward(
        batch,
        length,
        heads,
        dim,
        x.data_ptr(),
        query.data_ptr(),
        counts.data_ptr(),
        probs.data_ptr(),
        grad.data_ptr(),
        grad_x.data_ptr(),
        grad_query.data_ptr(),
        scratch.data_ptr(),
        threads,
    )
    return grad_x, grad_query


QUANT_FP32 = 0  # quant_pool.c's type code of float32 rows (fbgemm's SparseType.FP32)


@dataclass(frozen=True)
class QuantLayout:
    """Per feature (int64 tensors): table byte offset, row stride, type code, width, output column."""

    table_offsets: torch.Tensor
    strides: torch.Tensor
    types: torch.Tensor
    dims: torch.Tensor
    out_offsets: torch.Tensor
    total_dim: int


def _as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` as a contiguous `dtype` tensor, itself where it is one already (without the calls)."""
    return tensor if tensor.dtype == dtype and tensor.is_contiguous() else tensor.to(dtype).contiguous()


def quant_pool(
    buffer: torch.Tensor,
    layout: QuantLayout,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
    rows: torch.Tensor | None,
    threads: int | None = None,
) -> torch.Tensor | None:
    """(B, total_dim) float32 sums of the bags (see quant_pool.c for the layout), or None when an
    id is not below its feature's `rows` (not checked if None) or the offsets do not fit the ids.
    `threads`: the team's size (default `pool_threads`); each bag is summed by one thread in id
    order, so the count never changes the result."""
    lib = library()
    assert lib is not None, "quant_pool called where applies() is False"
    features = layout.dims.numel()
    batch = (offsets.numel() - 1) // features
    ids, offsets = _as(ids, torch.int64), _as(offsets, torch.int64)
    if weights is not None:
        weights = _as(weights, torch.float32)
    if rows is not None:
        rows = _as(rows, torch.int64)
    out = torch.empty(batch, layout.total_dim)
    status = lib.reccompile_quant_pool(
        features,
        batch,
        buffer.data_ptr(),
        layout.table_offsets.data_ptr(),
        layout.strides.data_ptr(),
        layout.types.data_ptr(),
        layout.dims.data_ptr(),
        layout.out_offsets.data_ptr(),
        layout.total_dim,
        ids.data_ptr(),
        ids.numel(),
        offsets.data_ptr(),
        None if weights is None else weights.data_ptr(),
        None if rows is None else rows.data_ptr(),
        out.data_ptr(),
        pool_threads(ids.numel()) if threads is None else threads,
    )
    return None if status else out


# Ids one thread of quant_pool pools before a second one pays: an int8 row of 64 values costs
# tens of ns, an OpenMP fork and join a few us, and on a shared core a team can wait a whole time
# slice for its second thread (inference-bench's int8 criteo tables on the busy 2-core Zen 4:
# 26 ids pooled in 4.4 ms wall on 2 threads against 58 us on one; 1,664 ids 2.1 ms against
# 0.7 ms). Predicts at batch 1 and 64 of dlrm-bench (26 and 1,664 ids) pool on the calling thread,
# unless the measured choice 'pool_team' (runtime/serving/quant_embedding.py) finds the team faster.
IDS_PER_THREAD = 1024


def pool_threads(ids: int) -> int:
    """Threads for a quant_pool call over `ids` ids: torch's count, at most one per IDS_PER_THREAD
    ids. Each bag is summed by one thread in id order, so the count never changes the result."""
    return max(1, min(torch.get_num_threads(), ids // IDS_PER_THREAD))


@dataclass(frozen=True)
class TableLayout:
    """A training TBE's host layout (int64 tensors): per table the element offsets of its weights
    and of its row-wise state, its rows and width; per feature its table and gradient column.
    `pool`: the same float32 weights as `quant_pool` reads them (per feature), for the forward;
    `feature_rows`: each feature's table's rows, which quant_pool checks the ids against."""

    weight_offsets: torch.Tensor
    momentum_offsets: torch.Tensor
    rows: torch.Tensor
    dims: torch.Tensor
    feature_tables: torch.Tensor
    grad_columns: torch.Tensor
    pool: QuantLayout
    feature_rows: torch.Tensor


def rowwise_adagrad_backward(
    weights: torch.Tensor,
    momentum: torch.Tensor,
    layout: TableLayout,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    sample_weights: torch.Tensor | None,
    grad: torch.Tensor,
    lr: float,
    eps: float,
) -> int:
    """Row-wise Adagrad on `weights` and `momentum` in place from the pooled gradient `grad`
    (B, width) of the bags `ids`/`offsets` (see rowwise_adagrad.c); 0, or the kernel's status bits
    (1: an id outside its table, 4: out of memory)."""
    lib = library()
    assert lib is not None, "rowwise_adagrad_backward called where applies() is False"
    features = layout.feature_tables.numel()
    batch = (offsets.numel() - 1) // features
    ids, offsets = ids.to(torch.int64).contiguous(), offsets.to(torch.int64).contiguous()
    # Rows further apart than their width (a table group's columns of the batch's gradient) are read in place.
    if grad.stride(1) != 1 or grad.stride(0) < grad.shape[1]:
        grad = grad.contiguous()
    if sample_weights is not None:
        sample_weights = sample_weights.to(torch.float32).contiguous()
    return lib.reccompile_rowwise_adagrad_backward(
        layout.rows.numel(),
        features,
        batch,
        weights.data_ptr(),
        layout.weight_offsets.data_ptr(),
        momentum.data_ptr(),
        layout.momentum_offsets.data_ptr(),
        layout.rows.data_ptr(),
        layout.dims.data_ptr(),
        layout.feature_tables.data_ptr(),
        layout.grad_columns.data_ptr(),
        grad.stride(0),
        ids.data_ptr(),
        offsets.data_ptr(),
        None if sample_weights is None else sample_weights.data_ptr(),
        grad.data_ptr(),
        lr,
        eps,
        torch.get_num_threads(),
    )


def in_batch_softmax(
    query: torch.Tensor,
    candidates: torch.Tensor,
    own: torch.Tensor,
    hits: tuple[torch.Tensor, torch.Tensor] | None,
    grad_scale: float,
    grads: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Per row i, -log softmax(query @ candidates^T)[i, own[i]] with the `hits` cells (rows ascending,
    columns) masked; with `grads`, the summed loss's gradients: d/dquery times `grad_scale`, and
    d/dcandidates (see in_batch_softmax.c). float32 [n, D] and [C, D] with D a multiple of 16."""
    lib = library()
    assert lib is not None, "in_batch_softmax called where applies() is False"
    query, candidates = query.contiguous(), candidates.contiguous()
    own = own.to(torch.int64).contiguous()
    n, dim = query.shape
    starts = columns = None
    if hits is not None:
        starts = torch.searchsorted(hits[0], torch.arange(n + 1, device=hits[0].device)).contiguous()
        columns = hits[1].to(torch.int64).contiguous()
    losses = torch.empty(n)
    grad_query = torch.empty(n, dim) if grads else None
    grad_candidates = torch.empty(candidates.shape) if grads else None
    status = lib.reccompile_in_batch_softmax(
        n,
        candidates.shape[0],
        dim,
        query.data_ptr(),
        candidates.data_ptr(),
        own.data_ptr(),
        None if starts is None else starts.data_ptr(),
        None if columns is None else columns.data_ptr(),
        losses.data_ptr(),
        None if grad_query is None else grad_query.data_ptr(),
        None if grad_candidates is None else grad_candidates.data_ptr(),
        grad_scale,
        torch.get_num_threads(),
    )
    if status:
        raise MemoryError("in-batch softmax: the native kernel could not allocate its scratch space")
    return losses, grad_query, grad_candidates
