"""Inference lowering: ModelIR -> the fx graph of the single-process serving program.

Runs in `reccompile export` in place of the planner and `split`: every table
is whole on one process, so the sparse stages of the training graph
(input_dist -> lookup -> output_dist -> wait) collapse into one call of
`runtime.serving.quant_embedding.QuantEmbeddingBagCollection`, whose tables keep
their per-table precision. The dense blocks and heads are the training
graph's own nodes (same targets, so the dense state dict carries over), and
the output order of the collection (table order, then each table's
features) is the order the world-size-1 lowering gives its one group, so the
column slices of the dense inputs are unchanged.

With `dense_dtype` bfloat16 (`reccompile export --dense bf16`) the dense
blocks compute in bfloat16: each dense input is cast once where it enters,
the collection pools straight into bfloat16, and every head's output is
cast back to float32 before it leaves.

Requires a validated IR; reuses `lower` and `check_shapes`, so a spec that
compiles for training lowers here too.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import ModelIR
from compiler.lowering.calls import table_config_call
from compiler.lowering.lower import lower
from compiler.lowering.shapes import check_shapes
from compiler.lowering.types import BuildArg, Call, LoweredModel, ModuleDecl
from compiler.planner.plan import RankPlan, Shard, ShardingPlan, TablePlan

GROUP = "table_wise"  # the one sparse group of the whole-table plan
EMBEDDINGS = "embeddings"  # the node holding the collection's KeyedTensor
_SPARSE_STAGES = ("input_dist", "lookup", "output_dist")
DENSE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def lower_inference(ir: ModelIR, dense_dtype: str = "fp32") -> LoweredModel:
    """The serving graph of `ir`, its dense blocks in `dense_dtype` ("fp32" or "bf16").

    The collection reads its tables' precisions and the dense dtype from the
    generated module's PRECISIONS and DENSE_DTYPE constants.
    """
    sequences = [feature for feature in ir.sparse if feature.is_sequence]
    if sequences:
        message = (
            f"sequence feature '{sequences[0].name}': exporting models with sequence features "
            "(pooling: none) is not supported yet"
        )
        raise CompileError([Diagnostic(sequences[0].loc, "features.sparse", message)])
    ir = dataclasses.replace(ir, sharding=dataclasses.replace(ir.sharding, world_size=1, device="cpu"))
    training = check_shapes(lower(ir, whole_table_plan(ir)))
    modules = tuple(
        ModuleDecl("sparse_arch", _collection_call(ir), decl.loc) if decl.target == "sparse_arch" else decl
        for decl in training.modules
    )
    graph = _serving_graph(training.graph, DENSE_DTYPES[dense_dtype])
    return LoweredModel(ir=training.ir, plan=training.plan, modules=modules, graph=graph)


def whole_table_plan(ir: ModelIR) -> ShardingPlan:
    """World size 1, every table whole on rank 0, table_wise: one sparse group in table order."""
    tables = tuple(
        TablePlan(
            table=t.name,
            sharding_type=GROUP,
            compute_kernel="fused",
            shards=(Shard(rank=0, row_offset=0, rows=t.num_embeddings, col_offset=0, cols=t.dim),),
            storage_bytes=0,
            cost_ms=0.0,
            reason="inference: every table whole on one process",
        )
        for t in ir.tables
    )
    return ShardingPlan(
        world_size=1,
        device="cpu",
        inputs_sha256=ir.source_sha256,
        tables=tables,
        ranks=(RankPlan(rank=0, bytes_used=0, bytes_available=0, cost_ms=0.0),),
    )


def _collection_call(ir: ModelIR) -> Call:
    return Call("runtime.serving.quant_embedding.QuantEmbeddingBagCollection", (
        ("tables", [table_config_call(table, training=False) for table in ir.tables]),
        ("precisions", BuildArg("PRECISIONS")),  # the module's constant: table -> precision
        ("is_weighted", any(feature.weighted for feature in ir.sparse)),
        ("output_dtype", BuildArg("DENSE_DTYPE")),  # the dense blocks' dtype
    ))


def _serving_graph(graph: fx.Graph, dtype: torch.dtype) -> fx.Graph:
    """A copy of `graph` with the sparse stages replaced by one `sparse_arch(sparse)` call,
    and with casts at the dense inputs and the heads unless `dtype` is float32."""
    cast = dtype != torch.float32
    serving = fx.Graph()
    copied: dict[fx.Node, fx.Node] = {}
    sparse_input: fx.Node | None = None
    for node in graph.nodes:
        stage = _sparse_stage(node)
        if stage in _SPARSE_STAGES:
            continue
        if node.op == "call_method" and node.target == "wait":
            assert sparse_input is not None
            new = serving.create_node("call_module", "sparse_arch", (sparse_input,), {}, name=EMBEDDINGS)
        elif node.op == "output" and cast:
            heads = {}
            for head, value in node.args[0].items():
                source = copied[value]
                heads[head] = serving.create_node("call_method", "float", (source,), name=f"{source.name}_fp32")
                heads[head].meta["loc"] = value.meta.get("loc")
            new = serving.output(heads)
        else:
            args = fx.map_arg(node.args, lambda n: copied[n])
            kwargs = fx.map_arg(node.kwargs, lambda n: copied[n])
            new = serving.create_node(
                node.op, node.target, args, kwargs, name=_rename(node.name), type_expr=node.type
            )
        new.meta.update({key: node.meta[key] for key in ("loc", "path", "stage") if key in node.meta})
        if cast and _is_dense_input(node):
            new = serving.create_node("call_method", "to", (new, dtype), name=f"{new.name}_{_short(dtype)}")
            new.meta["loc"] = node.meta["loc"]
        copied[node] = new
        if node.op == "placeholder" and node.target == "sparse":
            sparse_input = new
    serving.lint()
    return serving


def _is_dense_input(node: fx.Node) -> bool:
    """`dense['x']`: a feature taken from the dense placeholder."""
    return (
        node.op == "call_function"
        and node.target is operator.getitem
        and isinstance(node.args[0], fx.Node)
        and node.args[0].op == "placeholder"
        and node.args[0].target == "dense"
    )


def _short(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def _sparse_stage(node: fx.Node) -> str | None:
    if node.op != "call_module" or not isinstance(node.target, str):
        return None
    parts = node.target.split(".")
    return parts[2] if len(parts) == 3 and parts[0] == "sparse_arch" else None


def _rename(name: str) -> str:
    """`table_wise_values` -> `embeddings_values`: no sharding words in the serving code."""
    prefix = f"{GROUP}_"
    return EMBEDDINGS + "_" + name[len(prefix):] if name.startswith(prefix) else name

