"""The graphs of a retrieval model's `query_vectors` and `item_vectors`, cut from the lowered graph
(and the `<block>_item_rows` a gru's auxiliary loss looks its negatives up with).

Runs after `check_shapes` (on the final graph: `read_one_position` may have
changed a transformer's module) and before `emit`, which renders them as
the generated Model's methods beside `forward`. Both are copies of the
model's graph, pruned to what their output needs, so they call the same
submodules and the same sharded lookups with the same node names:

    query_vectors(dense, sparse)  the head's query; for a next-item head the
                                  vector of each sequence's last position
                                  (`last_positions`); L2-normalised when the
                                  head normalises
    item_vectors(ids)             the item side on a batch of ids, one id per
                                  sample (`item_batch`): the item feature's
                                  group alone, then the item tower; a
                                  collective at world size > 1. With
                                  `item_attributes`, the ids' attributes come
                                  from the model's `item_attributes` catalogue
                                  and every group holding one of them looks
                                  them up too

    %ids = placeholder[target=ids]
    %item_batch = item_batch(%ids, ['user_id', 'movie_id'], 'movie_id')
    %table_wise_ids = sparse_arch.table_wise.input_dist(%item_batch)
    ...
    %item_tower = item_tower(%sparse_movie_id)
    return normalize(%item_tower, dim=-1)
"""

from __future__ import annotations

import torch.fx as fx
import torch.nn.functional as F

from compiler.ir import Block, Head, ModelIR
from compiler.lowering.lower import sparse_groups
from compiler.lowering.sequences import sequence_groups
from compiler.lowering.types import LoweredModel
from compiler.planner.plan import ShardingPlan
from runtime.retrieval.head import item_batch, last_positions
from runtime.retrieval.next_behaviour import negative_batch, output_key

__all__ = ["retrieval_head", "query_graph", "item_graph", "item_rows_graph"]


def retrieval_head(ir: ModelIR) -> Head | None:
    """The model's sampled_softmax head (a spec has at most one), or None."""
    return next((head for head in ir.heads if head.retrieval is not None), None)


def query_graph(lowered: LoweredModel, head: Head) -> fx.Graph:
    """`query_vectors(dense, sparse) -> [B, D]` of `head`."""
    graph, nodes = _copy(lowered.graph)
    output = nodes[_head_output(lowered.graph, head)]
    query = output.args[0]
    assert isinstance(query, fx.Node)
    if head.retrieval is not None and head.retrieval.next_item:
        padded_items = output.args[1]  # to_padded(values, lengths, max_length): the sequence's lengths
        assert isinstance(padded_items, fx.Node)
        with graph.inserting_after(output):
            query = graph.call_function(last_positions, (query, padded_items.args[1]))
        query.name = f"{head.name}_last_query"
        query.meta["loc"] = head.loc
    graph.output(_normalized(graph, head, query))
    _prune(graph, keep_placeholders=True)
    return graph


def item_graph(lowered: LoweredModel, head: Head) -> fx.Graph:
    """`item_vectors(ids) -> [n, D]` of `head`: one sample per id, through the item feature's group."""
    retrieval = head.retrieval
    assert retrieval is not None
    graph, nodes = _copy(lowered.graph)
    item = nodes[_head_output(lowered.graph, head)].args[1]
    assert isinstance(item, fx.Node)
    if retrieval.next_item:
        item = item.args[0]  # to_padded's flat rows: one per id here
        assert isinstance(item, fx.Node)
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        ids = graph.placeholder("ids")
        attributes = graph.call_module("item_attributes", (ids,)) if retrieval.attributes else None
    if attributes is not None:
        attributes.meta["loc"] = head.loc
    read = (retrieval.item_feature, *retrieval.attributes)
    groups = _item_groups(lowered.ir, lowered.plan, read)
    for group, keys in groups:
        input_dist = next(
            n for n in graph.nodes if n.op == "call_module" and n.target == f"sparse_arch.{group}.input_dist"
        )
        extra = (attributes, list(retrieval.attributes)) if attributes is not None else ()
        with graph.inserting_before(input_dist):
            batch = graph.call_function(item_batch, (ids, keys, retrieval.item_feature, *extra))
            batch.name = "item_batch" if len(groups) == 1 else f"{group}_item_batch"
            batch.meta["loc"] = head.loc
        input_dist.args = (batch, *input_dist.args[1:])
    graph.output(_normalized(graph, head, item))
    _prune(graph, keep_placeholders=False, keep=(ids,))
    return graph


def item_rows_graph(lowered: LoweredModel, block: Block) -> fx.Graph:
    """`<block>_item_rows(ids, lengths) -> [n, D]`: the rows of ids[b, 1 : lengths[b]] in the table of the
    sparse sequence feature a gru with `aux_loss` reads (its negatives), through that feature's group."""
    graph, nodes = _copy(lowered.graph)
    aux = nodes[_output(lowered.graph, output_key(block.name))]
    padded = aux.args[1]  # to_padded(values, lengths, max_length): the feature's padded rows
    assert isinstance(padded, fx.Node) and isinstance(padded.args[0], fx.Node)
    feature = block.inputs[0].name
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        ids, lengths = graph.placeholder("ids"), graph.placeholder("lengths")
    [(group, keys)] = _item_groups(lowered.ir, lowered.plan, (feature,))
    input_dist = next(n for n in graph.nodes if n.op == "call_module" and n.target == f"sparse_arch.{group}.input_dist")
    with graph.inserting_before(input_dist):
        batch = graph.call_function(negative_batch, (ids, lengths, keys, feature))
        batch.name = f"{block.name}_negatives"
        batch.meta["loc"] = block.loc
    input_dist.args = (batch, *input_dist.args[1:])
    graph.output(padded.args[0])
    _prune(graph, keep_placeholders=False, keep=(ids, lengths))
    return graph


def _copy(graph: fx.Graph) -> tuple[fx.Graph, dict[fx.Node, fx.Node]]:
    copied = fx.Graph()
    nodes: dict[fx.Node, fx.Node] = {}
    copied.graph_copy(graph, nodes)
    return copied, nodes


def _head_output(graph: fx.Graph, head: Head) -> fx.Node:
    return _output(graph, head.name)


def _output(graph: fx.Graph, key: str) -> fx.Node:
    output = graph.output_node().args[0]
    assert isinstance(output, dict)
    return output[key]


def _normalized(graph: fx.Graph, head: Head, vectors: fx.Node) -> fx.Node:
    if head.retrieval is None or not head.retrieval.normalize:
        return vectors
    with graph.inserting_after(vectors):
        normalized = graph.call_function(F.normalize, (vectors,), {"dim": -1})
    normalized.meta["loc"] = head.loc
    return normalized


def _item_groups(ir: ModelIR, plan: ShardingPlan, features: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """The sharding groups (name, keys) that look one of `features` up."""
    groups = [
        (group, keys)
        for group, keys in [*sparse_groups(ir, plan), *sequence_groups(ir, plan)]
        if any(feature in keys for feature in features)
    ]
    if not groups:
        raise KeyError(features[0])
    return groups


def _prune(graph: fx.Graph, *, keep_placeholders: bool, keep: tuple[fx.Node, ...] = ()) -> None:
    """Erase every node the output does not need (placeholders too unless `keep_placeholders`)."""
    needed: set[fx.Node] = set()
    stack = [graph.output_node()]
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    for node in reversed(list(graph.nodes)):
        if node in needed or node in keep or (keep_placeholders and node.op == "placeholder"):
            continue
        graph.erase_node(node)
