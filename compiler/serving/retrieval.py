"""The retrieval side of the serving program: the query tower and the item tower as graphs of their own.

Runs in `reccompile export` after `lower_inference`, for a spec with a
`sampled_softmax` head. Each graph is the part of the serving graph that
computes one vector: the nodes the head's query (its `input`) depends on, or
the ones its item vector (a block, the item tower, or a sparse feature's
table row) depends on, with that node as the output; the head's output node
names both (its first two arguments). The same nodes with the
same targets, so the dense weights carry over; emit.py writes them as the
`_query_graph` and `_item_graph` methods behind the module's `query_vectors`
and `item_vectors`. A next-item head's query is a sequence [B, L, D]: its
query graph ends in `last_positions` of it (each request's last real
position, as the training module's `query_vectors`), and its item vector is
the item's own table row (the flat rows `to_padded` pads, one per id when
`item_vectors` asks one id per sample).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from compiler.ir import Head, ModelIR
from runtime.retrieval.head import last_positions


@dataclass(frozen=True)
class RetrievalGraphs:
    """The query and item graphs of a retrieval head, and the module's RETRIEVAL constant."""

    query: fx.Graph
    item: fx.Graph
    constant: dict[str, Any]


def retrieval_head(ir: ModelIR) -> Head | None:
    """The spec's retrieval head (the first `sampled_softmax` one), or None."""
    return next((head for head in ir.heads if head.retrieval is not None), None)


def retrieval_graphs(ir: ModelIR, serving: fx.Graph) -> RetrievalGraphs | None:
    """The query and item graphs of `ir`'s retrieval head cut from the serving graph; None without one."""
    head = retrieval_head(ir)
    if head is None or head.retrieval is None:
        return None
    retrieval = head.retrieval
    constant = {
        "head": head.name,
        "query": head.input.ref(),
        "item": retrieval.item.ref(),
        "item_feature": retrieval.item_feature,
        "item_table": retrieval.item_table,
        "normalize": retrieval.normalize,
        "dim": head.input.width,
        "next_item": retrieval.next_item,
    }
    query, item = _head_inputs(serving, head)
    if retrieval.next_item:
        query, item = _next_item_vectors(serving, head, query, item)
    return RetrievalGraphs(_cut(serving, query), _cut(serving, item), constant)


def _head_inputs(graph: fx.Graph, head: Head) -> tuple[fx.Node, fx.Node]:
    """The query and item vector nodes: the first two arguments of the head's output node
    (compiler.lowering.lower builds it from the query, the item vectors and the item ids)."""
    output = next(node for node in graph.nodes if node.name == f"{head.name}_output")
    query, item = output.args[0], output.args[1]
    assert isinstance(query, fx.Node) and isinstance(item, fx.Node)
    return query, item


def _next_item_vectors(graph: fx.Graph, head: Head, sequence: fx.Node, padded: fx.Node) -> tuple[fx.Node, fx.Node]:
    """A next-item head's query (the last real position of `sequence`, a node added after the head's
    output) and item vector (the flat rows that `padded`, to_padded(rows, lengths, max_length), pads)."""
    rows, lengths = padded.args[0], padded.args[1]
    assert isinstance(rows, fx.Node) and isinstance(lengths, fx.Node)
    output = next(node for node in graph.nodes if node.name == f"{head.name}_output")
    with graph.inserting_after(output):
        query = graph.call_function(last_positions, (sequence, lengths))
    query.name = f"{head.name}_last_query"
    query.meta["loc"] = head.loc
    return query, rows


def _cut(graph: fx.Graph, target: fx.Node) -> fx.Graph:
    """A new graph of `target` and the nodes it depends on (the placeholders always), returning it."""
    needed: set[fx.Node] = set()
    stack = [target]
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    cut = fx.Graph()
    copied: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        if node in needed or node.op == "placeholder":
            copied[node] = cut.node_copy(node, lambda n: copied[n])
    cut.output(copied[target])
    cut.lint()
    return cut
