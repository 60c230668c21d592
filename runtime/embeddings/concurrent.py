"""Run the lookups of several table groups at once, on one thread each, forward and backward.

fbgemm's CPU kernels for a table-batched lookup run on one thread: the
forward, and in the backward the sort of the ids by row that comes before
the (parallel) optimizer update. With 2 intra-op threads the multihot
dlrm-bench lookup takes as long as with one (≈ 13 ms forward, 39 ms
backward here). The collection therefore splits its tables into as many
groups as it has threads (runtime/embeddings/bag_collection.py) and this module runs the
groups side by side: the forward calls on a thread pool, and the backward as
one autograd call per group on the same pool, started from the backward of
`_Concurrent`, a function that stands for the whole set of lookups in the
caller's graph. Each pool thread runs its kernels with one intra-op thread
(`torch.set_num_threads` is per thread under OpenMP), so k groups keep k
cores busy and never more. Results are those of the sequential loop: the
same kernels on the same inputs.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["run_concurrently"]

Lookup = Callable[[], torch.Tensor]


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per size for the process, like torch's own intra-op pool; its threads use one
    intra-op thread each.

    `torch.set_num_threads` sets the calling thread's OpenMP team size, and also a process-wide
    value that any thread copies on its first parallel op. So every worker is started here and
    sets 1 for itself, then the caller sets its own count again, which restores that value for
    threads started later (DDP's, gloo's, the user's).
    """
    caller = torch.get_num_threads()
    started = threading.Barrier(threads)

    def start_single_threaded() -> None:
        torch.get_num_threads()  # torch's one-time per-thread setup first: it would undo the next line
        torch.set_num_threads(1)
        started.wait()

    pool = ThreadPoolExecutor(threads, thread_name_prefix="lookup")
    for future in [pool.submit(start_single_threaded) for _ in range(threads)]:
        future.result()
    torch.set_num_threads(caller)
    return pool


def _call_with_grad_mode(enabled: bool, lookup: Lookup) -> torch.Tensor:
    with torch.set_grad_enabled(enabled):  # grad mode is per thread
        return lookup()


class _Concurrent(torch.autograd.Function):
    """The lookups as one node: forward runs them, backward runs their graphs, all concurrently."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, pool: ThreadPoolExecutor, lookups: Sequence[Lookup], token: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        outputs = list(pool.map(functools.partial(_call_with_grad_mode, True), lookups))
        ctx.pool, ctx.outputs = pool, outputs
        return tuple(output.detach() for output in outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, None, None]:
        outputs, ctx.outputs = ctx.outputs, None  # the graphs are freed as they run
        pending = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        list(ctx.pool.map(lambda pair: torch.autograd.backward(pair[0], pair[1]), pending))
        return None, None, None


def run_concurrently(lookups: Sequence[Lookup], threads: int) -> list[torch.Tensor]:
    """Each lookup's output, the lookups run on `threads` threads (in order when 1).

    With grad enabled, the outputs' gradients flow back into each lookup's
    own graph (fbgemm's fused optimizer steps run there), concurrently too.
    """
    if threads <= 1 or len(lookups) <= 1:
        return [lookup() for lookup in lookups]
    pool = _pool(threads)
    if not torch.is_grad_enabled():
        return list(pool.map(functools.partial(_call_with_grad_mode, False), lookups))
    token = torch.empty(0, requires_grad=True)  # puts _Concurrent in the graph: the ids need no grad
    return list(_Concurrent.apply(pool, lookups, token))
