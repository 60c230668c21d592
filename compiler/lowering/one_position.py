"""Transformers read at one position: the `sequence_pool` that reads them moves into them.

A BST-style model encodes [target, history] and keeps only the target's
output (`sequence_pool` mode `first`), or a next-item model only the last
one (`last`). When that pool is a transformer's only reader, the pool node
goes and the transformer is built with `output="first"|"last"`
(runtime/modules/blocks/transformer.py), which returns the same [B, D] values (up to
float rounding) without computing the positions nobody reads: the last
layer's attention, feed-forward and norms run at one position, its keys and
values are never formed. The pool has no parameters, so the state dict is
unchanged.

    before:  %encoder: [B, 51, 64] = call_module encoder(%encoder_input, %encoder_lengths)
             %target_out: [B, 64] = call_module target_out(%encoder, %encoder_lengths)
    after:   %encoder: [B, 64] = call_module encoder(%encoder_input, %encoder_lengths)

Runs after `lower` and before `check_shapes`; rewrites the graph in place and
returns the model with the new submodule declarations.
"""

from __future__ import annotations

from dataclasses import replace

import torch.fx as fx

from compiler.lowering.types import Call, LoweredModel, ModuleDecl

__all__ = ["read_one_position"]

TRANSFORMER = "runtime.modules.blocks.transformer.Transformer"
SEQUENCE_POOL = "runtime.modules.blocks.sequence_pool.SequencePool"
ONE_POSITION_MODES = ("first", "last")


def read_one_position(lowered: LoweredModel) -> LoweredModel:
    """Fuses each `sequence_pool` of mode first/last into the transformer it alone reads."""
    decls = {decl.target: decl for decl in lowered.modules}
    for node in list(lowered.graph.nodes):
        pool = _only_pool_reader(node, decls)
        if pool is None:
            continue
        mode = dict(decls[str(pool.target)].call.kwargs)["mode"]
        pool.replace_all_uses_with(node)
        lowered.graph.erase_node(pool)
        decl = decls[str(node.target)]
        decls[decl.target] = replace(decl, call=Call(decl.call.factory, (*decl.call.kwargs, ("output", mode))))
        del decls[str(pool.target)]
    modules: tuple[ModuleDecl, ...] = tuple(decls[d.target] for d in lowered.modules if d.target in decls)
    return replace(lowered, modules=modules)


def _only_pool_reader(node: fx.Node, decls: dict[str, ModuleDecl]) -> fx.Node | None:
    """The first/last `sequence_pool` node that is a transformer node's only reader, on its lengths."""
    if not _calls(node, decls, TRANSFORMER) or len(node.users) != 1:
        return None
    pool = next(iter(node.users))
    if not _calls(pool, decls, SEQUENCE_POOL) or pool.args != (node, node.args[1]):
        return None
    return pool if dict(decls[str(pool.target)].call.kwargs)["mode"] in ONE_POSITION_MODES else None


def _calls(node: fx.Node, decls: dict[str, ModuleDecl], factory: str) -> bool:
    decl = decls.get(str(node.target)) if node.op == "call_module" else None
    return decl is not None and decl.call.factory == factory
