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

Lookup = Callable[..., torch.Tensor]  # no argument, or its input (run_concurrently)


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


def _call_with_grad_mode(enabled: bool, call: Callable[[], torch.Tensor]) -> torch.Tensor:
    with torch.set_grad_enabled(enabled):  # grad mode is per thread
        return call()


def _calls(lookups: Sequence[Lookup], inputs: Sequence[torch.Tensor | None]) -> list[Callable[[], torch.Tensor]]:
    """Each lookup bound to its input, if the caller gave inputs."""
    if not inputs:
        return list(lookups)
    return [functools.partial(lookup, tensor) for lookup, tensor in zip(lookups, inputs, strict=True)]


class _Concurrent(torch.autograd.Function):
    """The lookups as one node: forward runs them, backward runs their graphs, all concurrently.

    The inputs (a lookup's per-id weights) enter each lookup's graph as leaves of their own, so a
    lookup's backward stops there, and their gradients leave through this node into the caller's
    graph: the caller's graph behind them runs once, not once per lookup.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        pool: ThreadPoolExecutor,
        lookups: Sequence[Lookup],
        token: torch.Tensor,
        *inputs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        leaves = [None if x is None else x.detach().requires_grad_(x.requires_grad) for x in inputs]
        outputs = list(pool.map(functools.partial(_call_with_grad_mode, True), _calls(lookups, leaves)))
        ctx.pool, ctx.outputs, ctx.leaves = pool, outputs, leaves
        return tuple(output.detach() for output in outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        outputs, ctx.outputs = ctx.outputs, None  # the graphs are freed as they run
        pending = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        list(ctx.pool.map(lambda pair: torch.autograd.backward(pair[0], pair[1]), pending))
        return None, None, None, *(None if leaf is None else leaf.grad for leaf in ctx.leaves)


def run_concurrently(
    lookups: Sequence[Lookup], threads: int, inputs: Sequence[torch.Tensor | None] = ()
) -> list[torch.Tensor]:
    """Each lookup's output, the lookups run on `threads` threads (in order when 1).

    With `inputs` (one per lookup, None or a tensor), each lookup is called with its own.
    With grad enabled, the outputs' gradients flow back into each lookup's
    own graph (fbgemm's fused optimizer steps run there), concurrently too,
    and on to the inputs that require grad.
    """
    if threads <= 1 or len(lookups) <= 1:
        return [call() for call in _calls(lookups, inputs)]
    pool = _pool(threads)
    if not torch.is_grad_enabled():
        return list(pool.map(functools.partial(_call_with_grad_mode, False), _calls(lookups, inputs)))
    token = torch.empty(0, requires_grad=True)  # puts _Concurrent in the graph: the ids need no grad
    return list(_Concurrent.apply(pool, lookups, token, *inputs))
