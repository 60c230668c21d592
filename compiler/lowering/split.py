"""Split: cut the lowered graph at the pipeline boundary into its two stages.

Runs after `check_shapes` (so the stage graphs keep every node's meta: spec
location, stage, shape) and before `emit`. Requires `meta["pipeline_stage"]`
on every node (lower.py sets it) and no stage-0 node using a stage-1 value.
Guarantees three fx graphs, which the generated Model has as methods:

    input_dist(dense, sparse) -> (v1, ..., vn)   stage 0: placeholders, dense getitems,
                                                 every sparse_arch.<type>.input_dist
    compute(v1, ..., vn) -> {head: output}       stage 1: lookup, output_dist, wait,
                                                 blocks, heads
    forward(dense, sparse) -> {head: output}     input_dist, then compute

v1..vn, the cut, are the stage-0 values stage 1 uses, in graph order: dense
features and the input_dist awaitables, whose ids all-to-alls are in flight
when input_dist returns. Plain training calls `forward`; the pipeline
(runtime/train/train_pipeline.py) calls `input_dist` of batch i+1 before `compute` of
batch i; both run the same compiled code.

This is torch.fx.passes.split_module's partitioning, for two partitions.
That pass is not used because it needs the live submodules (the compiler
has only their declarations), flattens call_module targets
(`sparse_arch_table_wise_input_dist`) and leaves the heads' dict in the
parent graph; here the stages keep the qualified targets and the node names,
and `compute` returns the heads.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from compiler.lowering.types import LoweredModel, SplitModel, StageGraphs

INPUT_DIST, COMPUTE = 0, 1


def split_stages(lowered: LoweredModel) -> SplitModel:
    """`lowered` and its graph cut at meta["pipeline_stage"] into the two stages."""
    graph = lowered.graph
    nodes = [node for node in graph.nodes if node.op != "output"]
    _check_no_backward_edge(nodes)
    cut = [
        node
        for node in nodes
        if node.meta["pipeline_stage"] == INPUT_DIST
        and any(user.op == "output" or user.meta["pipeline_stage"] == COMPUTE for user in node.users)
    ]
    placeholders = [node for node in nodes if node.op == "placeholder"]
    stages = StageGraphs(
        input_dist=_input_dist_graph(nodes, cut),
        compute=_compute_graph(nodes, cut, graph.output_node()),
        forward=_forward_graph(placeholders, cut),
        cut=tuple(node.name for node in cut),
    )
    return SplitModel(ir=lowered.ir, plan=lowered.plan, modules=lowered.modules, graph=graph, stages=stages)


def _check_no_backward_edge(nodes: list[fx.Node]) -> None:
    for node in nodes:
        if node.meta["pipeline_stage"] != INPUT_DIST:
            continue
        for used in node.all_input_nodes:
            if used.meta["pipeline_stage"] != INPUT_DIST:
                raise ValueError(
                    f"split_stages: stage-0 node %{node.name} ({node.meta.get('loc')}) uses "
                    f"stage-1 value %{used.name}: the pipeline cannot run it ahead"
                )


def _input_dist_graph(nodes: list[fx.Node], cut: list[fx.Node]) -> fx.Graph:
    stage = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        if node.meta["pipeline_stage"] == INPUT_DIST:
            env[node] = stage.node_copy(node, env.__getitem__)
    stage.output(tuple(env[node] for node in cut))  # always a tuple: compute(*staged)
    return stage


def _compute_graph(nodes: list[fx.Node], cut: list[fx.Node], output: fx.Node) -> fx.Graph:
    stage = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in cut:
        env[node] = stage.create_node("placeholder", node.name, name=node.name, type_expr=node.type)
        env[node].meta = _crossing_meta(node)
    for node in nodes:
        if node.meta["pipeline_stage"] == COMPUTE:
            env[node] = stage.node_copy(node, env.__getitem__)
    stage.output(fx.map_arg(output.args[0], env.__getitem__))
    return stage


def _forward_graph(placeholders: list[fx.Node], cut: list[fx.Node]) -> fx.Graph:
    forward = fx.Graph()
    inputs = tuple(forward.node_copy(node) for node in placeholders)
    staged = forward.create_node("call_module", "input_dist", inputs, name="staged")
    staged.meta = {"pipeline_stage": INPUT_DIST, "stage": "input_dist"}
    values = []
    for index, node in enumerate(cut):
        value = forward.create_node("call_function", operator.getitem, (staged, index), name=node.name)
        value.meta = _crossing_meta(node)
        values.append(value)
    outputs = forward.create_node("call_module", "compute", tuple(values), name="outputs")
    outputs.meta = {"pipeline_stage": COMPUTE, "stage": "compute"}
    forward.output(outputs)
    return forward


def _crossing_meta(node: fx.Node) -> dict:
    """A value at the start of stage 1: where it was made, its shape, marked as crossing."""
    return {**node.meta, "pipeline_stage": COMPUTE, "stage": "cut"}
