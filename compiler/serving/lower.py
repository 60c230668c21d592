"""Inference lowering: ModelIR -> the fx graph of the single-process serving program.

Runs in `reccompile export` in place of the planner and `split`: every table
is whole on one process, so the sparse stages of the training graph
(input_dist -> lookup -> output_dist -> wait) collapse into one call per
group: the pooled tables' `table_wise` group into `sparse_arch`, a
`runtime.serving.quant_embedding.QuantEmbeddingBagCollection`, and the
sequence tables' `table_wise_sequence` group (a table serving at least one
`pooling: none` feature) into `sequence_arch`, a
`runtime.serving.quant_sequence.QuantEmbeddingCollection` returning the same
`{feature: JaggedTensor}` as the group's `wait`. Both keep the tables'
per-table precision. Everything else, the truncation of long sequences
included, is the training graph's own nodes (same targets, so the dense
state dict carries over), and the output order of each collection (table
order, then each table's features) is the order the world-size-1 lowering
gives its group, so the column slices of the dense inputs are unchanged.

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

from compiler.ir import Gru, ModelIR, Table
from compiler.lowering.calls import item_attributes_call, table_config_call
from compiler.lowering.lower import lower
from compiler.lowering.one_position import read_one_position
from compiler.lowering.shapes import check_shapes
from compiler.lowering.types import BuildArg, Call, LoweredModel, ModuleDecl
from compiler.planner.plan import RankPlan, Shard, ShardingPlan, TablePlan

GROUP = "table_wise"  # the sharding type of every table in the whole-table plan
SEQUENCE_GROUP = f"{GROUP}_sequence"  # its group of sequence tables (runtime.sharding.SparseArch)
EMBEDDINGS = "embeddings"  # the node holding the pooled collection's KeyedTensor
SEQUENCES = "sequences"  # the node holding the sequence collection's {feature: JaggedTensor}
# group of the training graph -> (module of the serving model, name of its output node)
_COLLECTIONS = {GROUP: ("sparse_arch", EMBEDDINGS), SEQUENCE_GROUP: ("sequence_arch", SEQUENCES)}
_SPARSE_STAGES = ("input_dist", "lookup", "output_dist")
# int8: the graph computes in float32; the loaded model's MLPs may run int8 layers (runtime/serving/packed_mlp.py).
DENSE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}


def lower_inference(ir: ModelIR, dense_dtype: str = "fp32") -> LoweredModel:
    """The serving graph of `ir`, its dense blocks in `dense_dtype` ("fp32" or "bf16").

    The collections read their tables' precisions and the dense dtype from the
    generated module's PRECISIONS (pooled tables), SEQUENCE_PRECISIONS (sequence
    tables) and DENSE_DTYPE constants.
    """
    ir = dataclasses.replace(ir, sharding=dataclasses.replace(ir.sharding, world_size=1, device="cpu"))
    ir = without_aux_losses(ir)
    # The training program's passes, so serving computes what training computed.
    training = check_shapes(read_one_position(lower(ir, whole_table_plan(ir))))
    modules: list[ModuleDecl] = []
    for decl in training.modules:
        if decl.target != "sparse_arch":
            modules.append(_single_process(decl))
            continue
        pooled, sequences = _split_tables(ir)
        if pooled:
            modules.append(ModuleDecl("sparse_arch", _collection_call(ir, pooled), decl.loc))
        if sequences:
            modules.append(ModuleDecl("sequence_arch", _sequence_collection_call(sequences), decl.loc))
    head = next((head for head in ir.heads if head.retrieval is not None), None)
    attributes = None if head is None else item_attributes_call(ir, head)
    if head is not None and attributes is not None:  # the item catalogue item_vectors reads
        modules.append(ModuleDecl("item_attributes", attributes, head.loc))
    graph = _serving_graph(training.graph, DENSE_DTYPES[dense_dtype])
    return LoweredModel(ir=training.ir, plan=training.plan, modules=tuple(modules), graph=graph)


def _single_process(decl: ModuleDecl) -> ModuleDecl:
    """The block without a process group: serving is one process, and batch norm and dropout are off in eval."""
    kwargs = tuple((key, None if value == BuildArg("process_group") else value) for key, value in decl.call.kwargs)
    return dataclasses.replace(decl, call=Call(decl.call.factory, kwargs))


def without_aux_losses(ir: ModelIR) -> ModelIR:
    """`ir` without its gru blocks' `aux_loss`: a training-only term, so serving has no auxiliary network."""
    blocks = tuple(
        dataclasses.replace(block, op=dataclasses.replace(block.op, aux_loss=None))
        if isinstance(block.op, Gru) and block.op.aux_loss is not None
        else block
        for block in ir.blocks
    )
    return dataclasses.replace(ir, blocks=blocks)


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


def _split_tables(ir: ModelIR) -> tuple[list[Table], list[Table]]:
    """(pooled tables, sequence tables), each in table order."""
    sequences = {table.name for table in ir.sequence_tables()}
    return (
        [t for t in ir.tables if t.name not in sequences],
        [t for t in ir.tables if t.name in sequences],
    )


def _collection_call(ir: ModelIR, tables: list[Table]) -> Call:
    return Call(
        "runtime.serving.quant_embedding.QuantEmbeddingBagCollection",
        (
            ("tables", [table_config_call(table, training=False) for table in tables]),
            ("precisions", BuildArg("PRECISIONS")),  # the module's constant: pooled table -> precision
            ("is_weighted", any(feature.weighted for feature in ir.sparse)),
            ("output_dtype", BuildArg("DENSE_DTYPE")),  # the dense blocks' dtype
        ),
    )


def _sequence_collection_call(tables: list[Table]) -> Call:
    return Call(
        "runtime.serving.quant_sequence.QuantEmbeddingCollection",
        (
            ("tables", [_sequence_table_call(table) for table in tables]),
            ("precisions", BuildArg("SEQUENCE_PRECISIONS")),  # sequence table -> precision
            ("output_dtype", BuildArg("DENSE_DTYPE")),
        ),
    )


def _sequence_table_call(table: Table) -> Call:
    """The table's runtime EmbeddingConfig; serving needs no init range or optimizer."""
    return Call(
        "runtime.config.embeddings.EmbeddingConfig",
        (
            ("name", table.name),
            ("num_embeddings", table.num_embeddings),
            ("embedding_dim", table.dim),
            ("feature_names", list(table.features)),
            ("where", str(table.loc)),
        ),
    )


def _serving_graph(graph: fx.Graph, dtype: torch.dtype) -> fx.Graph:
    """A copy of `graph` with each group's sparse stages replaced by one call of its collection on
    the group's input, and with casts at the dense inputs and the heads unless `dtype` is float32."""
    cast = dtype != torch.float32
    serving = fx.Graph()
    copied: dict[fx.Node, fx.Node] = {}
    group_inputs: dict[str, fx.Node] = {}  # group -> what its input_dist read (the KJT)
    for node in graph.nodes:
        group, stage = _sparse_stage(node)
        if group is not None and stage in _SPARSE_STAGES:
            if stage == "input_dist":
                group_inputs[group] = copied[node.args[0]]
            continue
        if node.op == "call_method" and node.target == "wait":
            waited, _ = _sparse_stage(node.args[0])
            module, name = _COLLECTIONS[waited]
            new = serving.create_node("call_module", module, (group_inputs[waited],), {}, name=name)
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
            new = serving.create_node(node.op, node.target, args, kwargs, name=_rename(node.name), type_expr=node.type)
        new.meta.update({key: node.meta[key] for key in ("loc", "path", "stage") if key in node.meta})
        if cast and _is_dense_input(node):
            new = serving.create_node("call_method", "to", (new, dtype), name=f"{new.name}_{_short(dtype)}")
            new.meta["loc"] = node.meta["loc"]
        copied[node] = new
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


def _sparse_stage(node: fx.Node) -> tuple[str | None, str | None]:
    """(group, stage) of a `sparse_arch.<group>.<stage>` call; (None, None) for any other node."""
    if node.op != "call_module" or not isinstance(node.target, str):
        return None, None
    parts = node.target.split(".")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "sparse_arch" else (None, None)


def _rename(name: str) -> str:
    """`table_wise_values` -> `embeddings_values`, `table_wise_sequence_x` -> `sequences_x`:
    no sharding words in the serving code."""
    for group in (SEQUENCE_GROUP, GROUP):
        module, output = _COLLECTIONS[group]
        if name.startswith(f"{group}_"):
            return f"{output}_{name[len(group) + 1 :]}"
    return name
