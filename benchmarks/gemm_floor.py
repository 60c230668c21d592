"""The GEMM floor of a training step: its dense matrix products, timed alone on this CPU.

A step's dense layers and interactions are matrix products (mm, addmm, bmm,
baddbmm in forward and backward); with them alone back to back, on the
same threads, the step could take no less. `gemm_shapes` runs one step under
a dispatch mode that records the shape of every product (with the kernel
choices forced to torch's own paths, runtime/cpu/choice.py: oneDNN's linear
and the C dot kernel compute the same products out of the mode's sight),
`floor` times torch.mm / torch.bmm at each shape on fresh operands (the
fastest of a few runs, and at one thread the thread's CPU time, so a
neighbour's preemption does not count) and sums them as the step calls them. dlrm_bench.py reports the floor, the step's
dense GFLOP and this CPU's sgemm GFLOP/s on them, and how far the step is
from the floor (`step_over_floor`): what lies between is everything else
(lookups, interaction glue, optimizers, copies, Python).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# op -> (positions of its two factors in args)
_FACTORS = {
    aten.mm.default: (0, 1),
    aten.addmm.default: (1, 2),
    aten.bmm.default: (0, 1),
    aten.baddbmm.default: (1, 2),
}
# The torch-side implementation of every kernel choice that computes products (runtime.cpu.choice.KERNELS).
TORCH_PATHS = "dot=torch,linear=aten,linear_grad_input=plain,attention=torch,packed_mlp=aten"

Shape = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: Counter[Shape] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in _FACTORS:
            left, right = (args[i] for i in _FACTORS[func])
            self.shapes[(tuple(left.shape), tuple(right.shape), left.dtype)] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _torch_paths() -> Iterator[None]:
    saved = os.environ.get("RECCOMPILE_KERNELS")
    os.environ["RECCOMPILE_KERNELS"] = TORCH_PATHS
    try:
        yield
    finally:
        if saved is None:
            del os.environ["RECCOMPILE_KERNELS"]
        else:
            os.environ["RECCOMPILE_KERNELS"] = saved


def gemm_shapes(step: Callable[[], object]) -> Counter[Shape]:
    """(left shape, right shape, dtype) -> calls, of every matrix product `step()` makes."""
    recorder = _Recorder()
    with _torch_paths(), recorder:
        step()
    return recorder.shapes


def flops(shape: Shape) -> int:
    """2 M K N (times the batch for bmm) of one product."""
    left, right, _ = shape
    batch = left[0] if len(left) == 3 else 1
    return 2 * batch * left[-2] * left[-1] * right[-1]


def _time_ms(shape: Shape, repeats: int) -> float:
    left, right, dtype = shape
    a, b = torch.randn(left).to(dtype), torch.randn(right).to(dtype)
    product = torch.bmm if len(left) == 3 else torch.mm
    out = product(a, b)  # warm-up, and the output buffer
    # one thread: its own CPU time, which a neighbour's preemption does not stretch
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    best = float("inf")
    for _ in range(repeats):
        started = clock()
        product(a, b, out=out)
        best = min(best, clock() - started)
    return best * 1e3


def floor(shapes: Counter[Shape], repeats: int = 7) -> dict[str, float]:
    """`gemm_floor_ms` (the products alone, each at its fastest), `dense_gflop` of one step and
    `sgemm_gflops`, the rate of this CPU's torch.mm on them at the current thread count."""
    ms = sum(count * _time_ms(shape, repeats) for shape, count in shapes.items())
    gflop = sum(count * flops(shape) for shape, count in shapes.items()) / 1e9
    return {
        "gemm_floor_ms": round(ms, 3),
        "dense_gflop": round(gflop, 4),
        "sgemm_gflops": round(gflop / (ms / 1e3), 1) if ms > 0 else 0.0,
    }
