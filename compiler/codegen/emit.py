"""Emit: render a lowered model as a plain, importable Python module.

Runs last in the pipeline. Deterministic: the same spec gives byte-identical
output on every run and machine (literals are rendered with `repr`, dicts in
insertion order, no timestamps, paths as given).
"""

from __future__ import annotations

import pprint
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import jinja2
import torch.fx as fx

from compiler import __version__
from compiler.ir import ModelIR
from compiler.lowering.calls import (
    aux_loss_blocks,
    aux_loss_call,
    dense_optimizer_call,
    head_config_call,
    item_attributes_call,
    lr_schedule_call,
    model_inputs_call,
    retrieval_loss_call,
)
from compiler.lowering.retrieval_graphs import item_graph, item_rows_graph, query_graph, retrieval_head
from compiler.lowering.types import BuildArg, Call, ModuleDecl, SplitModel
from runtime.retrieval.next_behaviour import output_key
from runtime.storage.output import removed_on_error, write_file

TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("compiler.codegen", "templates"),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,
    autoescape=False,
)
ASSIGNED_LINE = re.compile(r"^\s+([A-Za-z_][A-Za-z0-9_]*) = ")


@dataclass(frozen=True, slots=True)
class GeneratedModule:
    filename: str  # <name>.py
    source: str
    plan_filename: str  # <name>.plan.json
    plan_json: str

    def write(self, outdir: Path | str) -> list[Path]:
        """Write the module and its plan into `outdir`, each file whole or not at all (an OutputError
        names `outdir` and the cause; a folder this call made goes again)."""
        out = Path(outdir)
        written = []
        with removed_on_error(out):
            out.mkdir(parents=True, exist_ok=True)
            for name, text in ((self.filename, self.source), (self.plan_filename, self.plan_json)):
                path = out / name
                write_file(path, lambda stream, text=text: stream.write(text))
                written.append(path)
        return written


def emit(lowered: SplitModel) -> GeneratedModule:
    """Render the module text and the plan JSON of `lowered`."""
    ir = lowered.ir
    filename = f"{ir.name}.py"
    retrieval = _retrieval_sources(lowered)
    source = TEMPLATES.get_template("module.py.j2").render(
        version=__version__,
        source=ir.source,
        sha256=ir.source_sha256,
        name=ir.name,
        filename=filename,
        world_size=lowered.plan.world_size,
        inputs=inputs_source(ir),
        plan=python_literal(lowered.plan.to_dict()),
        heads=heads_source(ir),
        dense_optimizer=render_call(dense_optimizer_call(ir), indent=0),
        lr_schedule=render_call(lr_schedule_call(ir), indent=0),
        modules=[
            {"target": d.target, "loc": _short_loc(d.loc), "source": render_call(d.call, indent=8)}
            for d in lowered.modules
        ],
        extra_imports=extra_imports(lowered),
        retrieval=retrieval,
        aux_losses=_aux_loss_sources(lowered),
        **_stage_sources(lowered),
    )
    return GeneratedModule(filename, source, f"{ir.name}.plan.json", lowered.plan.to_json())


# What the template imports for every model; other runtime modules are imported when used.
TEMPLATE_IMPORTS = (
    "runtime.config.data",
    "runtime.config.embeddings",
    "runtime.config.heads",
    "runtime.config.lr_schedule",
    "runtime.config.training",
    "runtime.modules.blocks.pooled",
    "runtime.modules.heads.losses",
    "runtime.sharding",
)


def extra_imports(lowered: SplitModel) -> list[str]:
    """Import lines for the runtime modules of the model's factories and graph functions beyond the template's.

    The factories are called by their dotted names (`import runtime.x`); the
    functions the graph calls by the names fx's code gives them, imported as
    such (`from runtime.sparse.sequence import to_padded as runtime_sparse_sequence_to_padded`).
    """
    graphs = [lowered.stages.input_dist, lowered.stages.compute]
    modules = list(lowered.modules)
    head = retrieval_head(lowered.ir)
    if head is not None:
        graphs += [query_graph(lowered, head), item_graph(lowered, head)]
        modules.append(ModuleDecl("retrieval_loss", retrieval_loss_call(lowered.ir, head), head.loc))
        attributes = item_attributes_call(lowered.ir, head)
        if attributes is not None:
            modules.append(ModuleDecl("item_attributes", attributes, head.loc))
    for block in aux_loss_blocks(lowered.ir):
        graphs.append(item_rows_graph(lowered, block))
        modules.append(ModuleDecl(f"{block.name}_aux_loss", aux_loss_call(lowered.ir, block), block.loc))
    return runtime_imports(modules, graphs, TEMPLATE_IMPORTS) + transform_imports(lowered.ir)


def transform_imports(ir: ModelIR) -> list[str]:
    """The import of the feature transforms' configs, when INPUTS has some (runtime.config.transforms)."""
    features = [*ir.dense, *ir.sparse]
    return ["import runtime.config.transforms"] if any(f.transform is not None for f in features) else []


def runtime_imports(modules: Sequence[ModuleDecl], graphs: Sequence[fx.Graph], known: Sequence[str]) -> list[str]:
    """`extra_imports` for any module declarations and graphs, `known` being what a template imports."""
    imported: list[str] = []
    for decl in modules:
        for call in _calls(decl.call):
            module = call.factory.rpartition(".")[0]
            if module not in known and module not in imported:
                imported.append(module)
    lines = [f"import {module}" for module in imported]
    functions: dict[str, str] = {}
    for graph in graphs:
        for name, value in graph.python_code(root_module="self").globals.items():
            module = getattr(value, "__module__", None) or ""
            if callable(value) and module.startswith("runtime."):
                functions[name] = f"from {module} import {value.__qualname__} as {name}"
    return lines + sorted(functions.values())


def _calls(call: Call) -> list[Call]:
    """`call` and every Call among its arguments."""
    found = [call]
    for _, value in call.kwargs:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Call):
                found.extend(_calls(item))
    return found


def inputs_source(ir: ModelIR) -> str:
    """The INPUTS constant's value: the model's features, heads, training defaults and data section."""
    return render_call(model_inputs_call(ir), indent=0)


def heads_source(ir: ModelIR) -> str:
    """The HEADS constant's value: a tuple of the heads' runtime configs, one per line."""
    calls = "".join(f"    {render_call(head_config_call(head), indent=4)},\n" for head in ir.heads)
    return "(\n" + calls + ")"


def render_call(call: Call, indent: int) -> str:
    """`factory(k=v, ...)` on one line when short, else one argument per line."""
    args = [f"{key}={_value(value, indent + 4)}" for key, value in call.kwargs]
    one_line = f"{call.factory}({', '.join(args)})"
    if len(one_line) + indent <= 100 and "\n" not in one_line:
        return one_line
    pad = " " * (indent + 4)
    return f"{call.factory}(\n" + "".join(f"{pad}{a},\n" for a in args) + " " * indent + ")"


def _value(value: Any, indent: int) -> str:
    if isinstance(value, Call):
        return render_call(value, indent)
    if isinstance(value, BuildArg):
        return value.name
    if isinstance(value, list) and any(isinstance(v, Call) for v in value):
        pad = " " * (indent + 4)
        items = "".join(f"{pad}{_value(v, indent + 4)},\n" for v in value)
        return "[\n" + items + " " * indent + "]"
    return repr(value)


def python_literal(value: Any) -> str:
    """Plain data as deterministic Python source (dicts keep their order)."""
    return pprint.pformat(value, indent=1, width=100, sort_dicts=False, compact=True)


def _short_loc(loc: Any) -> str:
    return f"{loc.file}:{loc.line}"


def _stage_sources(lowered: SplitModel) -> dict[str, str]:
    """The methods `forward`, `input_dist` and `compute`: the code of split.py's stage graphs."""
    stages = lowered.stages
    return {
        "forward": _method_source("forward", stages.forward),
        "input_dist": _method_source("input_dist", stages.input_dist),
        "compute": _method_source("compute", stages.compute),
    }


def _retrieval_sources(lowered: SplitModel) -> dict[str, str] | None:
    """The retrieval head's loss module and the methods query_vectors and item_vectors, or None."""
    ir = lowered.ir
    head = retrieval_head(ir)
    if head is None or head.retrieval is None:
        return None
    retrieval = head.retrieval
    attributes = item_attributes_call(ir, head)
    return {
        "loc": _short_loc(head.loc),
        "loss": render_call(retrieval_loss_call(ir, head), indent=8),
        "attributes": "" if attributes is None else render_call(attributes, indent=8),
        "query_vectors": _method_source("query_vectors", query_graph(lowered, head)),
        "item_vectors": _method_source("item_vectors", item_graph(lowered, head)),
        "table": retrieval.item_table,
        "rows": str(ir.table(retrieval.item_table).num_embeddings),
        "query": "the last position of each sequence" if retrieval.next_item else "the query tower",
        "normalized": ", L2-normalised" if retrieval.normalize else "",
    }


def _aux_loss_sources(lowered: SplitModel) -> list[dict[str, str]]:
    """Per gru with `aux_loss`: its loss module, the method looking its negatives up, and its forward output."""
    sources = []
    for block in aux_loss_blocks(lowered.ir):
        rows = f"{block.name}_item_rows"
        sources.append(
            {
                "loc": _short_loc(block.loc),
                "block": block.name,
                "module": f"{block.name}_aux_loss",
                "loss": render_call(aux_loss_call(lowered.ir, block), indent=8),
                "table": lowered.ir.feature(block.inputs[0].name).table,
                "rows": rows,
                "item_rows": _method_source(rows, item_rows_graph(lowered, block)),
                "key": repr(output_key(block.name)),
            }
        )
    return sources


def _method_source(name: str, graph: fx.Graph) -> str:
    """fx's own code for `graph` as method `name`, each line tagged with its spec line."""
    code = graph.python_code(root_module="self").src.strip()
    if not code.startswith("def forward("):
        raise ValueError(f"unexpected fx code for method {name!r}: {code.splitlines()[0]}")
    code = f"def {name}(" + code[len("def forward(") :]
    locs = {node.name: node.meta.get("loc") for node in graph.nodes}
    lines = []
    for line in code.splitlines():
        match = ASSIGNED_LINE.match(line)
        loc = locs.get(match.group(1)) if match else None
        suffix = f"  # spec: {_short_loc(loc)}" if loc is not None else ""
        lines.append(("    " + line + suffix).rstrip())
    return "\n".join(lines) + "\n"
