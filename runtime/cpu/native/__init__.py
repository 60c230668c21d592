"""C kernels of the runtime, compiled on first use with the machine's C compiler.

DLRM's pairwise dot interaction (dot_interaction.c), 3-5x faster on the CPU
than `torch.bmm` over the full Gram matrix, and the pooled lookup of
quantized inference tables (quant_pool.c), which fbgemm runs on one thread.
They are plain C with no torch headers, so building them takes a second:
`$CC` (default `cc`) with -O3 -march=native, into
`$RECCOMPILE_CACHE_DIR` (default `~/.cache/reccompile`)/native/, named by a
hash of the source, the flags, the compiler and the CPU, written atomically so
that ranks starting together can race safely. Tensors cross by pointer
through ctypes, which releases the GIL for the call; the kernels split the
batch over torch's intra-op threads (OpenMP, see OPENMP_FLAGS).

Where no compiler works, `library()` returns None after one warning and the
blocks keep their torch implementations: same results, slower.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["QuantLayout", "applies", "cache_dir", "dot_backward", "dot_forward", "library", "quant_pool"]

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.c")))
FLAGS = (
    "-O3", "-march=native", "-fPIC", "-shared",
    # Reassociating sums lets the compiler vectorise the reductions, as a GEMM would.
    "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
)
# Threads come from OpenMP. The library names libgomp.so.1, which the loader
# resolves to the copy torch has already loaded (torch/lib/libgomp.so.1), so
# the kernels run on torch's own thread pool. A compiler without OpenMP
# builds the serial variant.
OPENMP_FLAGS = ("-fopenmp",)
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


def cache_dir() -> Path:
    root = os.environ.get("RECCOMPILE_CACHE_DIR")
    if root:
        return Path(root) / "native"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reccompile" / "native"


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU's feature flags where Linux lists them."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(handle)
    try:
        for extra in (OPENMP_FLAGS, ()):
            command = [compiler, *FLAGS, *extra, *map(str, SOURCES), "-o", scratch]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode == 0:
                break
        else:
            raise OSError(f"{compiler} exited with {done.returncode}: {done.stderr.strip()[:500]}")
        os.replace(scratch, target)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel library, or None (with a warning) if it cannot be built here."""
    compiler = os.environ.get("CC", "cc")
    key = hashlib.sha256(
        b"\0".join(
            part.encode() if isinstance(part, str) else part
            for part in (
                *(source.read_bytes() for source in SOURCES),
                " ".join(FLAGS + OPENMP_FLAGS), compiler, platform.machine(), _cpu_identity(),
            )
        )
    ).hexdigest()[:16]
    target = cache_dir() / f"kernels-{key}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        warnings.warn(f"reccompile: native kernels unavailable, using torch ops instead ({exc})", stacklevel=2)
        return None
    lib.reccompile_dot_forward.argtypes = [_I64, _I64, _PTR, _PTR, _I64, _PTR, _I64]
    lib.reccompile_dot_backward.argtypes = [_I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _I64]
    lib.reccompile_dot_forward.restype = lib.reccompile_dot_backward.restype = ctypes.c_int
    lib.reccompile_quant_pool.argtypes = [_I64, _I64, *[_PTR] * 6, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64]
    lib.reccompile_quant_pool.restype = ctypes.c_int
    return lib


def applies(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = torch.float32) -> bool:
    """Whether the kernels can take these tensors: on the CPU, of `dtype` (None: any), outside tracing."""
    return (
        all(t.device.type == "cpu" and (dtype is None or t.dtype == dtype) for t in tensors)
        and not torch.compiler.is_compiling()
        and not torch.compiler.is_exporting()
        and library() is not None
    )


def _pointers(tensors: Sequence[torch.Tensor]) -> ctypes.Array:
    return (_PTR * len(tensors))(*(t.data_ptr() for t in tensors))


def _counts(parts: Sequence[torch.Tensor], dim: int) -> ctypes.Array:
    return (_I64 * len(parts))(*(p.shape[1] // dim for p in parts))


def _check(status: int, what: str) -> None:
    if status != 0:
        raise MemoryError(f"dot interaction {what}: the native kernel could not allocate its scratch space")


def dot_forward(parts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """[z_0, <z_i, z_j> for i < j] per row; parts are contiguous (B, k_p * dim) float32."""
    lib = library()
    assert lib is not None, "dot_forward called where applies() is False"
    batch = parts[0].shape[0]
    n = sum(p.shape[1] for p in parts) // dim
    out = torch.empty(batch, dim + n * (n - 1) // 2)
    status = lib.reccompile_dot_forward(
        batch, len(parts), _pointers(parts), _counts(parts, dim), dim, out.data_ptr(), torch.get_num_threads()
    )
    _check(status, "forward")
    return out


def dot_backward(parts: Sequence[torch.Tensor], dim: int, grad_out: torch.Tensor) -> list[torch.Tensor]:
    """The gradient of `dot_forward(parts, dim)` for each part, given the output's (contiguous)."""
    lib = library()
    assert lib is not None, "dot_backward called where applies() is False"
    grads = [torch.empty_like(p) for p in parts]
    status = lib.reccompile_dot_backward(
        parts[0].shape[0], len(parts), _pointers(parts), _counts(parts, dim), dim,
        grad_out.data_ptr(), _pointers(grads), torch.get_num_threads(),
    )
    _check(status, "backward")
    return grads


@dataclass(frozen=True)
class QuantLayout:
    """Per feature (int64 tensors): table byte offset, row stride, type code, width, output column."""

    table_offsets: torch.Tensor
    strides: torch.Tensor
    types: torch.Tensor
    dims: torch.Tensor
    out_offsets: torch.Tensor
    total_dim: int


def quant_pool(
    buffer: torch.Tensor,
    layout: QuantLayout,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
    rows: torch.Tensor | None,
) -> torch.Tensor | None:
    """(B, total_dim) float32 sums of the bags (see quant_pool.c for the layout), or None when an
    id is not below its feature's `rows` (not checked if None) or the offsets do not fit the ids."""
    lib = library()
    assert lib is not None, "quant_pool called where applies() is False"
    features = layout.dims.numel()
    batch = (offsets.numel() - 1) // features
    ids, offsets = ids.to(torch.int64).contiguous(), offsets.to(torch.int64).contiguous()
    if weights is not None:
        weights = weights.to(torch.float32).contiguous()
    if rows is not None:
        rows = rows.to(torch.int64).contiguous()
    out = torch.empty(batch, layout.total_dim)
    status = lib.reccompile_quant_pool(
        features, batch, buffer.data_ptr(), layout.table_offsets.data_ptr(), layout.strides.data_ptr(),
        layout.types.data_ptr(), layout.dims.data_ptr(), layout.out_offsets.data_ptr(), layout.total_dim,
        ids.data_ptr(), ids.numel(), offsets.data_ptr(), None if weights is None else weights.data_ptr(),
        None if rows is None else rows.data_ptr(), out.data_ptr(), torch.get_num_threads(),
    )
    return None if status else out
