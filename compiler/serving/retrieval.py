"""The retrieval side of the serving program: the query tower and the item tower as graphs of their own.

Runs in `reccompile export` after `lower_inference`, for a spec with a
`sampled_softmax` head. Each graph is the part of the serving graph that
computes one vector: the nodes the head's query (its `input`) depends on, or
the ones its item vector (a block, the item tower, or a sparse feature's
table row) depends on, with that node as the output; the head's output node
names both (its first two arguments). The same nodes with the
same targets, so the dense weights carry over; emit.py writes them as the
`_query_graph` and `_item_graph` methods behind the module's `query_vectors`
and `item_vectors`. A next-item head (a sequence query) is not exported for
retrieval: its query is a position of a sequence, not a block output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from compiler.ir import Head, ModelIR
from runtime.serving.export_dir import ExportError


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
    """The query and item graphs of `ir`'s two-tower retrieval head cut from the serving graph;
    None without one (`check_exportable` refuses a next-item head before)."""
    head = retrieval_head(ir)
    if head is None or head.retrieval is None or head.retrieval.next_item:
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
    }
    query, item = _head_inputs(serving, head)
    return RetrievalGraphs(_cut(serving, query), _cut(serving, item), constant)


def check_exportable(ir: ModelIR) -> None:
    """An ExportError for a next-item retrieval head, whose query is a sequence position."""
    head = retrieval_head(ir)
    if head is not None and head.retrieval is not None and head.retrieval.next_item:
        raise ExportError(
            f"{head.loc}: head {head.name!r} trains next-item (a sequence query): exporting it for retrieval "
            f"is not supported yet; export a two-tower head (a vector query)"
        )


def _head_inputs(graph: fx.Graph, head: Head) -> tuple[fx.Node, fx.Node]:
    """The query and item vector nodes: the first two arguments of the head's output node
    (compiler.lowering.lower builds it from the query, the item vectors and the item ids)."""
    output = next(node for node in graph.nodes if node.name == f"{head.name}_output")
    query, item = output.args[0], output.args[1]
    assert isinstance(query, fx.Node) and isinstance(item, fx.Node)
    return query, item


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
