"""The canonical text of a lowered graph: what golden files and `reccompile graph` show.

One line per node, in graph order:

    %bottom: [B, 64] = call_module bottom(%dense_int)  # 1:dense  specs/dlrm_criteo.yaml:12:3

the output shape (when known, batch dimension as `B`), the operation, the
pipeline stage and the stage name, and the spec location. Stable across runs
and machines: no addresses, no absolute paths. `stages_text` shows the same
nodes as split.py cuts them: the generated Model's `input_dist`, `compute`
and `forward`.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx
from torch.fx.node import _get_qualified_name

from compiler.lowering.types import LoweredModel, SplitModel


def graph_text(lowered: LoweredModel) -> str:
    ir, plan = lowered.ir, lowered.plan
    lines = [f"graph {ir.name} (world size {plan.world_size})"]
    for node in lowered.graph.nodes:
        lines.append("  " + _node_line(node))
    return "\n".join(lines) + "\n"


def stages_text(lowered: SplitModel) -> str:
    """The graph cut for the pipeline (split.py): stage 0, stage 1, and forward calling both."""
    ir, plan, stages = lowered.ir, lowered.plan, lowered.stages
    cut = ", ".join(f"%{name}" for name in stages.cut)
    lines = [f"stages {ir.name} (world size {plan.world_size}): cut at {cut}"]
    for title, graph in (
        ("input_dist: stage 0, run ahead on the next batch after its device copy", stages.input_dist),
        ("compute: stage 1", stages.compute),
        ("forward: input_dist, then compute", stages.forward),
    ):
        lines.append(title)
        lines.extend("  " + _node_line(node) for node in graph.nodes)
    return "\n".join(lines) + "\n"


def _node_line(node: fx.Node) -> str:
    if node.op == "output":
        return f"return {_arg(node.args[0])}"
    shape = node.meta.get("shape")
    head = f"%{node.name}" + (f": {_shape(shape)}" if shape is not None else "")
    body = f"{node.op} {_target(node)}"
    if node.op != "placeholder":
        args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs.items()]
        body += "(" + ", ".join(args) + ")"
    loc = node.meta.get("loc")
    where = f"{node.meta.get('pipeline_stage', '?')}:{node.meta.get('stage', '?')}"
    return f"{head} = {body}  # {where}  {loc}" if loc else f"{head} = {body}  # {where}"


def _target(node: fx.Node) -> str:
    if isinstance(node.target, str):
        return node.target
    return _get_qualified_name(node.target).replace("_operator.", "operator.")


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("B" if i == 0 else str(d) for i, d in enumerate(shape)) + "]"


def _arg(value: Any) -> str:
    if isinstance(value, fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_arg(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_arg(v)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        start = "" if value.start is None else value.start
        stop = "" if value.stop is None else value.stop
        return f"{start}:{stop}"
    return repr(value)
