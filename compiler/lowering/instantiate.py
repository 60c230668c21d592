"""Build real modules from a LoweredModel's declarations: the in-memory GraphModule.

The generated module builds the same declarations from rendered source; this
is the same program without the round trip through a file, used by tests
and by `reccompile graph`.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

import torch
import torch.fx as fx

from compiler.ir import ModelIR
from compiler.lowering.calls import head_config_call, model_inputs_call
from compiler.lowering.types import BuildArg, Call, LoweredModel


def build_call(call: Call, build_args: Mapping[str, Any]) -> Any:
    """Evaluate a `Call`: import its runtime factory and call it with built arguments."""
    module_name, _, attr = call.factory.rpartition(".")
    if not module_name.startswith("runtime"):
        raise ValueError(f"factory {call.factory!r} is not in the runtime")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(**{key: _build_value(value, build_args) for key, value in call.kwargs})


def _build_value(value: Any, build_args: Mapping[str, Any]) -> Any:
    if isinstance(value, Call):
        return build_call(value, build_args)
    if isinstance(value, BuildArg):
        return build_args[value.name]
    if isinstance(value, list):
        return [_build_value(item, build_args) for item in value]
    return value


def model_inputs(ir: ModelIR) -> Any:
    """The runtime's `ModelInputs` of `ir`, as the generated module's INPUTS builds it."""
    heads = tuple(build_call(head_config_call(head), {}) for head in ir.heads)
    return build_call(model_inputs_call(ir), {"HEADS": heads})


def instantiate(
    lowered: LoweredModel,
    *,
    plan: Mapping[str, Any] | None = None,
    process_group: Any = None,
    device: torch.device | str | None = None,
) -> fx.GraphModule:
    """A GraphModule running `lowered.graph` on freshly built runtime modules."""
    build_args = {
        "plan": dict(plan) if plan is not None else lowered.plan.to_dict(),
        "process_group": process_group,
        "device": device,
    }
    root = torch.nn.Module()
    for decl in lowered.modules:
        module = build_call(decl.call, build_args)
        if device is not None and decl.target != "sparse_arch":
            module = module.to(device)
        setattr(root, decl.target, module)
    graph_module = fx.GraphModule(root, lowered.graph, class_name=lowered.ir.name)
    # GraphModule copies only the leaves the graph calls; keep whole modules so
    # parameters and state_dict match the generated module's.
    for decl in lowered.modules:
        setattr(graph_module, decl.target, getattr(root, decl.target))
    return graph_module
