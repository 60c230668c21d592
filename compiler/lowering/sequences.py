"""The sequence part of the lowering: sequence groups, sequence values and the five sequence blocks.

Used by `compiler.lowering.lower`'s graph builder, which owns the graph and
the values; this module adds the nodes of sequences to it:

    %sparse_cut = truncate_keyed(%sparse, {key: (max_length, keep)})   # stage 0, once
    <type>_sequence: input_dist(%sparse_cut) -> lookup -> output_dist -> wait
    %history_rows = getitem(%<type>_sequence_embeddings, 'history')     # JaggedTensor
    %history_lengths = lengths(%history_rows)                            # [B]
    %history = to_padded(values(%history_rows), %history_lengths, L)     # [B, L, D]
    %sparse_item = pool_rows(%item_rows, 'sum')                          # a pooled feature, [B, D]
    %sparse_tags = _position_weights.tags(%tags_rows)                    # position-weighted, [B, D]

A sequence value is its padded node and its lengths node, kept together
(`lengths`); a transformer's prepended vectors add positions, so its output
has lengths of its own.
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

import torch
import torch.fx as fx

from compiler.ir import Block, Gru, Hstu, Input, Location, ModelIR, SequencePool, Table, TargetAttention, Transformer
from compiler.lowering.calls import POSITION_WEIGHTS, position_weights_call
from compiler.lowering.types import ModuleDecl
from compiler.planner.plan import ShardingPlan
from runtime.modules.blocks.target_attention import join_fields
from runtime.retrieval.next_behaviour import next_behaviour_inputs, output_key
from runtime.sharding.types import SHARDING_TYPES
from runtime.sparse.sequence import pad_times, pool_rows, to_padded, truncate_keyed


class GraphBuilder(Protocol):
    """What this module needs of the graph builder that owns the graph (compiler.lowering.lower's),
    which builds a SequenceLowering over itself: the arrow points from lower to here only."""

    ir: ModelIR
    plan: ShardingPlan
    modules: list[ModuleDecl]
    values: dict[str, fx.Node]  # Input.ref() -> node
    group_keys: dict[str, list[str]]

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
    ) -> fx.Node: ...

    def build_group(self, group: str, keys: list[str], sparse: fx.Node, looked_up: str) -> None: ...

    def embeddings(self, group: str, loc: Location) -> fx.Node: ...

    def value(self, item: Input, loc: Location) -> fx.Node: ...


def groups_of(tables: list[Table], plan: ShardingPlan, suffix: str) -> list[tuple[str, list[str]]]:
    """(group name, feature keys) per sharding type of `tables`, in SHARDING_TYPES order.

    The runtime's SparseArch groups tables by sharding type; inside a group,
    keys follow table order, then each table's feature order.
    """
    groups: list[tuple[str, list[str]]] = []
    for sharding_type in SHARDING_TYPES:
        keys = [
            feature
            for table in tables
            if plan.table(table.name).sharding_type == sharding_type
            for feature in table.features
        ]
        if keys:
            groups.append((sharding_type + suffix, keys))
    return groups


def sequence_groups(ir: ModelIR, plan: ShardingPlan) -> list[tuple[str, list[str]]]:
    """(group name `<type>_sequence`, feature keys) per group of sequence tables."""
    return groups_of(list(ir.sequence_tables()), plan, "_sequence")


class SequenceLowering:
    """Adds the sequence nodes to a graph builder's graph (see the module docstring)."""

    def __init__(self, builder: GraphBuilder) -> None:
        self.builder = builder
        self.ir = builder.ir
        self.home: dict[str, str] = {}  # feature of a sequence table -> its group
        self.lengths: dict[str, fx.Node] = {}  # sequence value (Input.ref()) -> its lengths node
        self.cut: fx.Node | None = None  # the batch with its sequences cut to max_length
        self.aux_outputs: dict[str, fx.Node] = {}  # output key -> a gru's NextBehaviourInputs (training's loss)

    def node(self, op: str, target: Any, args: tuple, name: str, loc: Location, **kwargs: Any) -> fx.Node:
        return self.builder.node(op, target, args, kwargs.pop("kw", None), name=name, loc=loc, **kwargs)

    def build_groups(self, sparse: fx.Node) -> None:
        groups = sequence_groups(self.ir, self.builder.plan)
        if not groups:
            return
        limits = {f.name: (f.max_length, f.keep) for f in self.ir.sparse if f.is_sequence}
        for stamps in self.ir.timestamps:
            limits[stamps.name] = limits[stamps.sequence]
        first = next((f for f in self.ir.sparse if f.is_sequence), None)
        if first is None:  # only position-weighted features: nothing to cut
            self.cut = sparse
        else:
            self.cut = self.node(
                "call_function", truncate_keyed, (sparse, limits), "sparse_cut", first.loc, stage="input"
            )
        weighted = [f for f in self.ir.sparse if f.position_weighted]
        if weighted:
            self.builder.modules.append(ModuleDecl(POSITION_WEIGHTS, position_weights_call(self.ir), weighted[0].loc))
        for group, keys in groups:
            self.builder.group_keys[group] = keys
            for key in keys:
                self.home[key] = group
            self.builder.build_group(group, keys, self.cut, "rows")

    def feature(self, name: str, loc: Location) -> fx.Node:
        """A feature of a sequence table: its padded rows [B, L, D] (a sequence) or its pooled vector."""
        ref = f"sparse.{name}"
        values = self.builder.values
        if ref in values:
            return values[ref]
        feature = self.ir.feature(name)
        embeddings = self.builder.embeddings(self.home[name], loc)
        rows = self.node("call_function", operator.getitem, (embeddings, name), f"{name}_rows", loc, stage="dense")
        if feature.is_sequence:
            lengths = self.node("call_method", "lengths", (rows,), f"{name}_lengths", loc, stage="dense")
            flat = self.node("call_method", "values", (rows,), f"{name}_values", loc, stage="dense")
            values[ref] = self.node(
                "call_function",
                to_padded,
                (flat, lengths, feature.max_length),
                f"sequence_{name}",
                loc,
                stage="dense",
            )
            self.lengths[ref] = lengths
            return values[ref]
        if feature.position_weighted:
            values[ref] = self.node(
                "call_module", f"{POSITION_WEIGHTS}.{name}", (rows,), f"sparse_{name}", loc, stage="dense"
            )
            return values[ref]
        args: tuple = (rows, self.ir.table(feature.table).pooling)
        if feature.weighted:
            ids = self.node("call_function", operator.getitem, (self.cut, name), f"{name}_ids", loc, stage="dense")
            args += (self.node("call_method", "weights", (ids,), f"{name}_weights", loc, stage="dense"),)
        values[ref] = self.node("call_function", pool_rows, args, f"sparse_{name}", loc, stage="dense")
        return values[ref]

    def sequence(self, item: Input, loc: Location) -> tuple[fx.Node, fx.Node]:
        """A sequence value's padded node and lengths node."""
        padded = self.builder.value(item, loc)
        return padded, self.lengths[item.ref()]

    def block(self, block: Block) -> None:
        """The block's nodes; the module (declared by the builder) is called by the block's name."""
        op, loc, name = block.op, block.loc, block.name
        path = f"model.{name}"
        x, lengths = self.sequence(block.inputs[0], loc)
        values = self.builder.values
        if isinstance(op, SequencePool):
            values[name] = self.node("call_module", name, (x, lengths), name, loc, stage="dense", path=path)
        elif isinstance(op, TargetAttention):
            query = self.builder.value(op.query, loc)
            if op.query_fields:
                # Fields of one history joined position by position: one attention over the joined width.
                parts = [query] + [self.builder.value(item, loc) for item in op.query_fields]
                query = self.node(
                    "call_function", torch.cat, (parts,), f"{name}_query", loc, stage="dense", kw={"dim": 1}
                )
                fields = [self.sequence(item, loc) for item in block.inputs]
                x = self.node(
                    "call_function",
                    join_fields,
                    ([f[0] for f in fields], [f[1] for f in fields]),
                    f"{name}_fields",
                    loc,
                    stage="dense",
                )
            values[name] = self.node("call_module", name, (query, x, lengths), name, loc, stage="dense", path=path)
        elif isinstance(op, Transformer):
            if op.prepend:
                vectors = [self.builder.value(item, loc) for item in op.prepend]
                before = self.node(
                    "call_function", torch.stack, (vectors,), f"{name}_prepend", loc, stage="dense", kw={"dim": 1}
                )
                x = self.node(
                    "call_function", torch.cat, ([before, x],), f"{name}_input", loc, stage="dense", kw={"dim": 1}
                )
                lengths = self.node(
                    "call_function", operator.add, (lengths, len(op.prepend)), f"{name}_lengths", loc, stage="dense"
                )
            values[name] = self.node("call_module", name, (x, lengths), name, loc, stage="dense", path=path)
            self.lengths[name] = lengths
        elif isinstance(op, Gru):
            args = (x, lengths) if op.query is None else (x, lengths, self.builder.value(op.query, loc))
            values[name] = self.node("call_module", name, args, name, loc, stage="dense", path=path)
            self.lengths[name] = lengths
            if op.aux_loss is not None and op.aux_loss.weight > 0:
                self.aux_outputs[output_key(name)] = self.node(
                    "call_function",
                    next_behaviour_inputs,
                    (values[name], x, lengths),
                    f"{name}_aux_loss",
                    loc,
                    stage="dense",
                )
        else:
            assert isinstance(op, Hstu)
            times = self.timestamps(op.timestamps, lengths, loc)
            for layer in range(op.num_layers):
                last = layer == op.num_layers - 1
                x = self.node(
                    "call_module",
                    f"{name}.{layer}",
                    (x, lengths, times),
                    name if last else f"{name}_{layer}",
                    loc,
                    stage="dense",
                    path=path,
                )
            values[name] = x
            self.lengths[name] = lengths

    def timestamps(self, item: Input, lengths: fx.Node, loc: Location) -> fx.Node:
        """The padded timestamps of `item`, checked against `lengths`, their sequence's."""
        ref = item.ref()
        values = self.builder.values
        if ref not in values:
            assert self.cut is not None and item.length is not None
            times = self.node(
                "call_function", operator.getitem, (self.cut, item.name), f"{item.name}_ids", loc, stage="dense"
            )
            values[ref] = self.node(
                "call_function",
                pad_times,
                (times, item.length, lengths),
                f"timestamps_{item.name}",
                loc,
                stage="dense",
            )
        return values[ref]
