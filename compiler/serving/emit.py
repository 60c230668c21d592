"""Emit the inference module: a lowered serving program -> `<name>.py` of an export directory.

Runs in `reccompile export` after `compiler.serving.lower`. Like the
training module (codegen/emit.py) the text is deterministic and readable: the
model's INPUTS, the tables' precisions, a `Model` whose `forward` is the fx
graph's own code tagged with spec lines, and `build()` returning the eval
model with the directory's weights. It imports torch and the runtime only.
"""

from __future__ import annotations

from compiler import __version__
from compiler.codegen.emit import (
    ASSIGNED_LINE,
    TEMPLATES,
    heads_source,
    inputs_source,
    python_literal,
    render_call,
    runtime_imports,
)
from compiler.lowering.types import LoweredModel

_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}
# What inference.py.j2 imports for every model; other runtime modules are imported when used.
TEMPLATE_IMPORTS = (
    "runtime.data.features",
    "runtime.modules.blocks",
    "runtime.embeddings.bag_collection",
    "runtime.modules.losses",
    "runtime.serving.export_dir",
    "runtime.serving.quant_embedding",
)


def emit_inference(lowered: LoweredModel, precisions: dict[str, str], dense_dtype: str = "fp32") -> str:
    """The text of the inference module of `lowered`: tables at `precisions`, dense blocks in
    `dense_dtype` ("fp32" or "bf16", as `lower_inference` was given)."""
    ir = lowered.ir
    sequences = {table.name for table in ir.sequence_tables()}
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
            if sequences else None
        ),
        dense_dtype=_DTYPES[dense_dtype],
        sparse_keys=python_literal([f for t in ir.tables for f in t.features]),
        tables=[
            {"name": t.name, "rows": t.num_embeddings, "dim": t.dim,
             "pooling": "sequences" if t.name in sequences else t.pooling, "precision": precisions[t.name]}
            for t in ir.tables
        ],
        modules=[
            {"target": d.target, "loc": f"{d.loc.file}:{d.loc.line}", "source": render_call(d.call, indent=8)}
            for d in lowered.modules
        ],
        extra_imports=runtime_imports(lowered.modules, (lowered.graph,), TEMPLATE_IMPORTS),
        forward=_forward_source(lowered),
    )


def _forward_source(lowered: LoweredModel) -> str:
    """fx's code for the graph as the `forward` method, each line tagged with its spec line."""
    code = lowered.graph.python_code(root_module="self").src.strip()
    locs = {node.name: node.meta.get("loc") for node in lowered.graph.nodes}
    lines = []
    for line in code.splitlines():
        match = ASSIGNED_LINE.match(line)
        loc = locs.get(match.group(1)) if match else None
        suffix = f"  # spec: {loc.file}:{loc.line}" if loc is not None else ""
        lines.append(("    " + line + suffix).rstrip())
    return "\n".join(lines) + "\n"
