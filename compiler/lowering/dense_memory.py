"""Dense memory check: the replicated blocks must fit beside each rank's table shards.

Runs after the shape check. The planner places tables under each rank's
memory; every rank also holds every dense block whole (data parallel), its
gradients, and the dense optimizer's state per parameter (adagrad one slot,
adam two). A block that cannot be allocated (`layers: [1000000000000, 8]`)
otherwise passes `check` and fails only when `train` builds it. Activations
are not counted, so this is a floor: a model that passes may still run out.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from compiler.diagnostics import CompileError, Diagnostic
from compiler.lowering.instantiate import build_call
from compiler.lowering.types import LoweredModel
from compiler.planner.topology import format_bytes

# Tensors per parameter beyond itself and its gradient, by dense optimizer.
OPTIMIZER_SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "adamw": 2}


def check_dense_memory(lowered: LoweredModel) -> LoweredModel:
    """Raise CompileError, at the largest block, when the dense blocks do not fit a rank."""
    sizes = _block_bytes(lowered)  # {target: (parameter bytes, buffer bytes)}
    if not sizes:
        return lowered
    optimizer = lowered.ir.training.dense_optimizer.type
    copies = 2 + OPTIMIZER_SLOTS[optimizer]
    parameters = sum(p for p, _ in sizes.values())
    need = copies * parameters + sum(b for _, b in sizes.values())
    tightest = min(lowered.plan.ranks, key=lambda r: r.bytes_available - r.bytes_used)
    free = tightest.bytes_available - tightest.bytes_used
    if need <= free:
        return lowered
    largest = max(sizes, key=lambda target: sum(sizes[target]))
    node = next(n for n in lowered.graph.nodes if n.op == "call_module" and n.target == largest)
    held = f", {format_bytes(tightest.bytes_used)} of them for its table shards" if tightest.bytes_used else ""
    message = (
        f"the dense blocks need at least {format_bytes(need)} on every rank ({format_bytes(parameters)} of "
        f"parameters, held {copies} times with their gradients and {optimizer}'s state), but rank "
        f"{tightest.rank} has {format_bytes(tightest.bytes_available)}{held}; "
        f"the largest block is '{largest}' ({format_bytes(sum(sizes[largest]))})"
    )
    raise CompileError([Diagnostic(node.meta["loc"], node.meta.get("path", ""), message)])


def _block_bytes(lowered: LoweredModel) -> dict[str, tuple[int, int]]:
    """(parameter bytes, buffer bytes) per dense submodule the graph calls, built on the meta device."""
    called = {n.target for n in lowered.graph.nodes if n.op == "call_module"}
    sizes = {}
    for decl in lowered.modules:
        if decl.target == "sparse_arch" or decl.target not in called:
            continue
        with torch.device("meta"):
            module = build_call(decl.call, {"process_group": None})
        sizes[decl.target] = (_bytes(module.parameters()), _bytes(module.buffers()))
    return sizes


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


__all__ = ["OPTIMIZER_SLOTS", "check_dense_memory"]
