"""Lowering: ModelIR + ShardingPlan -> a torch.fx graph of the distributed program.

Requires a validated IR (blocks in topological order) and a plan covering
every table; runs after the planner and before code generation. The graph
is built node by node from the IR, never traced, and shows every stage:

    input_dist -> lookup -> output_dist   (one triple per sharding type in the plan)
    -> wait -> dense blocks in DAG order -> heads

A sampled_softmax head's output is a RetrievalOutput (runtime/retrieval/
head.py) of its query, its item vectors and the batch's item ids, which are
read from the batch in stage 0.

A model with sequence features first cuts them (and their timestamps) to
their max_length (`truncate_keyed`); its sequence tables have groups of their
own (`<type>_sequence`) whose output is each feature's rows, a JaggedTensor.
A sequence value is two nodes, the padded [B, max_length, D] rows and the
lengths [B], kept together; a pooled feature of a sequence table is pooled
from its rows (`pool_rows`). A field stack is one [B, N, D] node: a `stack`
block unflattens its vector inputs (a run of k adjacent sparse features is
one [B, k * D] slice) and concatenates them along the fields; `dot` and `fm`
read a stack flattened; a dense feature with `embed` is its
`dense_<name>_embedding` module's output.

Each node carries `meta["loc"]` (its spec location), `meta["stage"]` and
`meta["pipeline_stage"]` (0: the input side the pipeline runs ahead, 1: the
rest). Submodules are described by `ModuleDecl`s, plain data that the
in-memory GraphModule (`instantiate`) and the generated module (codegen)
both build from, so the two are the same program.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from compiler.ir import (
    SEQUENCE_OPS,
    STACK_OPS,
    Block,
    Concat,
    DenseFeature,
    Dot,
    DotProduct,
    Fm,
    Head,
    Input,
    Location,
    ModelIR,
    Moe,
    Product,
    Stack,
    Sum,
)
from compiler.lowering.calls import block_call, numeric_embedding_call, sparse_arch_call
from compiler.lowering.sequences import SequenceLowering, groups_of
from compiler.lowering.types import Call, LoweredModel, ModuleDecl
from compiler.planner.plan import ShardingPlan
from compiler.spec.module_names import numeric_embedding_name
from runtime.retrieval.head import next_item_output, two_tower_output


def lower(ir: ModelIR, plan: ShardingPlan) -> LoweredModel:
    """Build the fx graph and the submodule declarations of `ir` under `plan`."""
    builder = _GraphBuilder(ir, plan)
    builder.build()
    return LoweredModel(ir=ir, plan=plan, modules=tuple(builder.modules), graph=builder.graph)


def sparse_groups(ir: ModelIR, plan: ShardingPlan) -> list[tuple[str, list[str]]]:
    """(sharding type, output feature keys) per group, in the runtime's order.

    The runtime's SparseArch groups tables by sharding type in
    SHARDING_TYPES; inside a group, keys follow table order, then each
    table's feature order. The lowering must agree, so it asks the same rule.
    """
    pooled = [table for table in ir.tables if table not in ir.sequence_tables()]
    return groups_of(pooled, plan, "")


class _GraphBuilder:
    def __init__(self, ir: ModelIR, plan: ShardingPlan) -> None:
        self.ir = ir
        self.plan = plan
        self.graph = fx.Graph()
        self.modules: list[ModuleDecl] = []
        self.values: dict[str, fx.Node] = {}  # Input.ref() -> node
        self.sparse_home: dict[str, tuple[str, int]] = {}  # feature -> (group, index in its keys)
        self.group_keys: dict[str, list[str]] = {}
        self.group_pending: dict[str, fx.Node] = {}  # group -> output_dist awaitable node
        self.group_ready: dict[str, fx.Node] = {}  # group -> waited KeyedTensor node
        self.sequences = SequenceLowering(self)
        self.unembedded: dict[str, DenseFeature] = {}  # dense features with `embed`, until first read
        self.sparse: fx.Node | None = None  # the batch's placeholder

    # -- nodes -------------------------------------------------------------
    def node(
        self,
        op: str,
        target: Any,
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        name: str,
        loc: Location,
        stage: str,
        path: str = "",
    ) -> fx.Node:
        created = self.graph.create_node(op, target, args, kwargs or {}, name=name)
        created.meta["loc"] = loc
        created.meta["path"] = path
        created.meta["stage"] = stage
        created.meta["pipeline_stage"] = 0 if stage in ("input", "input_dist") else 1
        return created

    def build(self) -> None:
        ir = self.ir
        dense = self.node("placeholder", "dense", name="dense", loc=ir.loc, stage="input")
        dense.type = dict[str, torch.Tensor]
        sparse = self.node("placeholder", "sparse", name="sparse", loc=ir.loc, stage="input")
        self.sparse = sparse
        for feature in ir.dense:
            self.values[f"dense.{feature.name}"] = self.node(
                "call_function",
                operator.getitem,
                (dense, feature.name),
                name=f"dense_{feature.name}",
                loc=feature.loc,
                stage="input",
            )
            if feature.is_stack:
                self.modules.append(
                    ModuleDecl(_embedding_target(feature), numeric_embedding_call(feature), feature.loc)
                )
                self.unembedded[f"dense.{feature.name}"] = feature
        self.build_sparse(sparse)
        for block in ir.blocks:
            self.build_block(block)
        outputs = {head.name: self.build_head(index, head) for index, head in enumerate(ir.heads)}
        self.graph.output({**outputs, **self.sequences.aux_outputs})

    # -- sparse stages -----------------------------------------------------
    def build_sparse(self, sparse: fx.Node) -> None:
        ir = self.ir
        if not ir.tables:
            return
        self.modules.append(ModuleDecl("sparse_arch", sparse_arch_call(ir), ir.tables[0].loc))
        for group, keys in sparse_groups(ir, self.plan):
            self.group_keys[group] = keys
            for index, key in enumerate(keys):
                self.sparse_home[key] = (group, index)
            self.build_group(group, keys, sparse, "pooled")
        self.sequences.build_groups(sparse)

    def build_group(self, group: str, keys: list[str], sparse: fx.Node, looked_up: str) -> None:
        """The group's three stages; its output is waited for where it is first used."""
        loc = self.ir.table(_table_of(self.ir, keys[0])).loc
        ids = self.node(
            "call_module",
            f"sparse_arch.{group}.input_dist",
            (sparse,),
            name=f"{group}_ids",
            loc=loc,
            stage="input_dist",
        )
        result = self.node(
            "call_module",
            f"sparse_arch.{group}.lookup",
            (ids,),
            name=f"{group}_{looked_up}",
            loc=loc,
            stage="lookup",
        )
        self.group_pending[group] = self.node(
            "call_module",
            f"sparse_arch.{group}.output_dist",
            (result,),
            name=f"{group}_embeddings_pending",
            loc=loc,
            stage="output_dist",
        )

    def embeddings(self, group: str, loc: Location) -> fx.Node:
        """The group's KeyedTensor, waited for just before its first use.

        Placing the wait late lets dense blocks that need no embeddings (the
        bottom MLP) run while the output all-to-all is in flight.
        """
        if group not in self.group_ready:
            self.group_ready[group] = self.node(
                "call_method",
                "wait",
                (self.group_pending[group],),
                name=f"{group}_embeddings",
                loc=loc,
                stage="output_dist",
            )
        return self.group_ready[group]

    def sparse_run(self, features: list[str], loc: Location, name: str, keyed: bool = False) -> fx.Node:
        """One B x (k*dim) tensor for features contiguous in one group's output; with `keyed`, the
        group's KeyedTensor itself where the run is the whole group."""
        group, first = self.sparse_home[features[0]]
        embeddings = self.embeddings(group, loc)
        keys = self.group_keys[group]
        if len(features) == 1:
            return self.node(
                "call_function",
                operator.getitem,
                (embeddings, features[0]),
                name=f"sparse_{features[0]}",
                loc=loc,
                stage="dense",
            )
        if len(features) == len(keys) and keyed:
            return embeddings
        if len(features) == len(keys):
            return self.node("call_method", "values", (embeddings,), name=f"{group}_values", loc=loc, stage="dense")
        widths = [self.ir.table(_table_of(self.ir, key)).dim for key in keys]
        start = sum(widths[:first])
        stop = start + sum(widths[first : first + len(features)])
        values = self.node("call_method", "values", (embeddings,), name=f"{group}_values", loc=loc, stage="dense")
        return self.node(
            "call_function",
            operator.getitem,
            (values, (slice(None), slice(start, stop))),
            name=name,
            loc=loc,
            stage="dense",
        )

    # -- blocks ------------------------------------------------------------
    def input_nodes(self, block_name: str, inputs: tuple[Input, ...], loc: Location) -> list[fx.Node]:
        """Nodes for the inputs; runs of sparse features contiguous in one group become one node."""
        return [node for node, _ in self.input_runs(block_name, inputs, loc)]

    def input_runs(
        self, block_name: str, inputs: tuple[Input, ...], loc: Location, keyed: bool = False
    ) -> list[tuple[fx.Node, list[Input]]]:
        """`input_nodes` with the inputs each node holds (several for a run of sparse features);
        `keyed` as `sparse_run` takes it."""
        nodes: list[tuple[fx.Node, list[Input]]] = []
        run: list[Input] = []

        def flush() -> None:
            if run:
                names = [i.name for i in run]
                nodes.append((self.sparse_run(names, loc, f"{block_name}_sparse", keyed), list(run)))
                run.clear()

        for item in inputs:
            if item.kind == "sparse" and item.name in self.sparse_home:
                if run:
                    group, index = self.sparse_home[run[-1].name]
                    if self.sparse_home[item.name] != (group, index + 1):
                        flush()
                run.append(item)
                continue
            flush()
            nodes.append((self.value(item, loc), [item]))
        flush()
        return nodes

    def vector_nodes(self, block: Block, keyed: bool = False) -> list[fx.Node]:
        """`input_nodes` with each field stack flattened to [B, N * D]: dot and fm read its fields as
        vectors; `keyed` as `sparse_run` takes it."""
        nodes = []
        for node, items in self.input_runs(block.name, block.inputs, block.loc, keyed):
            if items[0].is_stack:
                node = self.node(
                    "call_method", "flatten", (node, 1), name=f"{block.name}_fields", loc=block.loc, stage="dense"
                )
            nodes.append(node)
        return nodes

    def stack(self, block: Block) -> fx.Node:
        """The inputs as one field stack [B, N, D]: vectors unflattened to fields, concatenated along them."""
        parts = []
        for node, items in self.input_runs(block.name, block.inputs, block.loc):
            if not items[0].is_stack:
                node = self.node(
                    "call_method",
                    "unflatten",
                    (node, 1, (len(items), block.width)),
                    name=f"{block.name}_fields",
                    loc=block.loc,
                    stage="dense",
                )
            parts.append(node)
        if len(parts) == 1:
            return parts[0]
        return self.node(
            "call_function",
            torch.cat,
            (parts,),
            {"dim": 1},
            name=block.name,
            loc=block.loc,
            stage="dense",
            path=f"model.{block.name}",
        )

    def value(self, item: Input, loc: Location) -> fx.Node:
        if item.ref() in self.unembedded:
            self.embed_dense(self.unembedded.pop(item.ref()))
        if item.kind == "sparse" and item.name in self.sparse_home:
            return self.sparse_run([item.name], loc, f"sparse_{item.name}")
        if item.kind == "sparse":
            return self.sequences.feature(item.name, loc)
        return self.values[item.ref()]

    def embed_dense(self, feature: DenseFeature) -> None:
        """The feature's field stack, made where it is first read: after the sparse stages have started."""
        ref, target = f"dense.{feature.name}", _embedding_target(feature)
        self.values[ref] = self.node(
            "call_module",
            target,
            (self.values[ref],),
            name=target,
            loc=feature.loc,
            stage="dense",
            path=f"features.dense.{feature.name}",
        )

    def concat(self, name: str, nodes: list[fx.Node], loc: Location) -> fx.Node:
        if len(nodes) == 1:
            return nodes[0]
        return self.node("call_function", torch.cat, (nodes,), {"dim": 1}, name=name, loc=loc, stage="dense")

    def build_block(self, block: Block) -> None:
        op, loc, name = block.op, block.loc, block.name
        path = f"model.{name}"
        if isinstance(op, SEQUENCE_OPS):
            self.declare(block, block_call(block, block.inputs[0].width))
            self.sequences.block(block)
            return
        if isinstance(op, Stack):
            self.values[name] = self.stack(block)
            return
        if isinstance(op, STACK_OPS):
            self.declare(block, block_call(block, block.inputs[0].width))
            x = self.value(block.inputs[0], loc)
            self.values[name] = self.node("call_module", name, (x,), name=name, loc=loc, stage="dense", path=path)
            return
        in_width = sum(item.width for item in block.inputs)
        if isinstance(op, (DotProduct, Sum, Product)):
            # One tensor per input: these blocks read their inputs as separate vectors, so a run of
            # sparse features adjacent in one group must not arrive as one merged tensor.
            self.declare(block, block_call(block, in_width))
            nodes = [self.value(item, loc) for item in block.inputs]
            self.values[name] = self.node(
                "call_module", name, tuple(nodes), name=name, loc=loc, stage="dense", path=path
            )
            return
        dot_or_fm = isinstance(op, (Dot, Fm))
        # The dot interaction takes a whole group's KeyedTensor: where the pooled all-to-all's
        # received pieces are whole vectors, it reads them where they lie (runtime/modules/blocks/pooled.py).
        nodes = (
            self.vector_nodes(block, keyed=isinstance(op, Dot))
            if dot_or_fm
            else self.input_nodes(name, block.inputs, loc)
        )
        if isinstance(op, Concat):
            self.values[name] = self.node(
                "call_function",
                torch.cat,
                (nodes,),
                {"dim": 1},
                name=name,
                loc=loc,
                stage="dense",
                path=path,
            )
            return
        if isinstance(op, Dot):
            self.declare(block, block_call(block, in_width))
            self.values[name] = self.node(
                "call_module", name, tuple(nodes), name=name, loc=loc, stage="dense", path=path
            )
            return
        x = self.concat(f"{name}_input", nodes, loc)
        self.declare(block, block_call(block, in_width))
        result = self.node("call_module", name, (x,), name=name, loc=loc, stage="dense", path=path)
        if isinstance(op, Moe):
            for index, task in enumerate(op.tasks):
                self.values[f"{name}.{task}"] = self.node(
                    "call_function",
                    operator.getitem,
                    (result, index),
                    name=f"{name}_{task}",
                    loc=loc,
                    stage="dense",
                )
        else:
            self.values[name] = result

    def declare(self, block: Block, call: Call) -> None:
        self.modules.append(ModuleDecl(block.name, call, block.loc))

    def build_head(self, index: int, head: Head) -> fx.Node:
        x = self.value(head.input, head.loc)
        if head.retrieval is not None:
            return self.build_retrieval_head(index, head, x)
        if head.loss == "softmax":
            return x
        return self.node(
            "call_method",
            "squeeze",
            (x, -1),
            name=f"{head.name}_output",
            loc=head.loc,
            stage="head",
            path=f"heads[{index}]",
        )

    def build_retrieval_head(self, index: int, head: Head, query: fx.Node) -> fx.Node:
        """The head's RetrievalOutput: the query, the positives' vectors and their ids (read in stage 0)."""
        retrieval = head.retrieval
        assert retrieval is not None
        item = self.value(retrieval.item, head.loc)
        batch = self.sequences.cut if retrieval.next_item else self.sparse
        ids = self.node(
            "call_function",
            operator.getitem,
            (batch, retrieval.item_feature),
            name=f"{head.name}_item_ids",
            loc=head.loc,
            stage="input",
        )
        attributes = tuple(
            self.node(
                "call_function",
                operator.getitem,
                (batch, name),
                name=f"{head.name}_attribute_{name}",
                loc=head.loc,
                stage="input",
            )
            for name in retrieval.attributes
        )
        output = next_item_output if retrieval.next_item else two_tower_output
        return self.node(
            "call_function",
            output,
            (query, item, ids, *attributes),
            name=f"{head.name}_output",
            loc=head.loc,
            stage="head",
            path=f"heads[{index}]",
        )


def _embedding_target(feature: DenseFeature) -> str:
    return numeric_embedding_name(feature.name)


def _table_of(ir: ModelIR, feature: str) -> str:
    for item in ir.sparse:
        if item.name == feature:
            return item.table
    raise KeyError(feature)
