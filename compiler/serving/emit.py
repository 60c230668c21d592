"""Emit the inference module: a lowered serving program -> `<name>.py` of an export directory.

Runs in `reccompile export` after `compiler.serving.lower` (and cuts the
retrieval towers with `compiler.serving.retrieval`). Like the
training module (codegen/emit.py) the text is deterministic and readable: the
model's INPUTS, the tables' precisions, a `Model` whose `forward` is the fx
graph's own code tagged with spec lines, and `build()` returning the eval
model with the directory's weights. It imports torch and the runtime only.
"""

from __future__ import annotations

import torch.fx as fx

from compiler import __version__
from compiler.codegen.emit import (
    ASSIGNED_LINE,
    TEMPLATES,
    heads_source,
    inputs_source,
    python_literal,
    render_call,
    runtime_imports,
    transform_imports,
)
from compiler.ir import ModelIR
from compiler.lowering.types import LoweredModel
from compiler.serving.retrieval import retrieval_graphs, retrieval_head

_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "int8": "torch.float32"}  # int8: see lower.DENSE_DTYPES
# What inference.py.j2 imports for every model; other runtime modules are imported when used.
TEMPLATE_IMPORTS = (
    "runtime.config.data",
    "runtime.config.embeddings",
    "runtime.config.heads",
    "runtime.modules.blocks.pooled",
    "runtime.serving.export_dir",
    "runtime.serving.quant_embedding",
)


def emit_inference(lowered: LoweredModel, precisions: dict[str, str], dense_dtype: str = "fp32") -> str:
    """The text of the inference module of `lowered`: tables at `precisions`, dense blocks in
    `dense_dtype` ("fp32" or "bf16", as `lower_inference` was given); for a retrieval head
    also its query and item towers (compiler.serving.retrieval)."""
    ir = lowered.ir
    retrieval = retrieval_graphs(ir, lowered.graph)
    sequences = {table.name for table in ir.sequence_tables()}
    graphs = (lowered.graph,) if retrieval is None else (lowered.graph, retrieval.query, retrieval.item)
    return TEMPLATES.get_template("inference.py.j2").render(
        version=__version__,
        source=ir.source,
        sha256=ir.source_sha256,
        name=ir.name,
        inputs=inputs_source(ir),
        heads=heads_source(ir),
        precisions=python_literal({t.name: precisions[t.name] for t in ir.tables if t.name not in sequences}),
        sequence_precisions=(
            python_literal({t.name: precisions[t.name] for t in ir.tables if t.name in sequences})
            if sequences
            else None
        ),
        dense_dtype=_DTYPES[dense_dtype],
        sparse_keys=python_literal([f for t in ir.tables for f in t.features]),
        tables=[
            {
                "name": t.name,
                "rows": t.num_embeddings,
                "dim": t.dim,
                "pooling": "sequences" if t.name in sequences else t.pooling,
                "precision": precisions[t.name],
            }
            for t in ir.tables
        ],
        modules=[
            {"target": d.target, "loc": f"{d.loc.file}:{d.loc.line}", "source": render_call(d.call, indent=8)}
            for d in lowered.modules
        ],
        extra_imports=runtime_imports(lowered.modules, graphs, TEMPLATE_IMPORTS) + transform_imports(ir),
        forward=_method_source(lowered.graph, "forward"),
        retrieval=None
        if retrieval is None
        else {
            "constant": python_literal(retrieval.constant),
            "query": _method_source(retrieval.query, "_query_graph"),
            "item": _method_source(retrieval.item, "_item_graph"),
            "weighted": any(feature.weighted for feature in ir.sparse),
            "attributes": _attribute_keys(ir),
        },
    )


def _attribute_keys(ir: ModelIR) -> str | None:
    """The retrieval head's `item_attributes` as a Python list literal, or None without any."""
    head = retrieval_head(ir)
    attributes = () if head is None or head.retrieval is None else head.retrieval.attributes
    return python_literal(list(attributes)) if attributes else None


def _method_source(graph: fx.Graph, name: str) -> str:
    """fx's code for `graph` as the method `name`, each line tagged with its spec line."""
    code = graph.python_code(root_module="self").src.strip()
    locs = {node.name: node.meta.get("loc") for node in graph.nodes}
    lines = []
    for line in code.splitlines():
        if line.startswith("def forward("):
            line = f"def {name}(" + line[len("def forward(") :]
        match = ASSIGNED_LINE.match(line)
        loc = locs.get(match.group(1)) if match else None
        suffix = f"  # spec: {loc.file}:{loc.line}" if loc is not None else ""
        lines.append(("    " + line + suffix).rstrip())
    return "\n".join(lines) + "\n"
