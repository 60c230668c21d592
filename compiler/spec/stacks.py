"""The field stack blocks of the model DAG: `stack` and the blocks that read one stack.

Used by `compiler.spec.build`, beside `compiler.spec.values` (the value kinds).
A field stack is [B, N, D]: N fields of one width D. `stack` makes one from
vectors (a pooled sparse feature, a dense feature, a vector block: one field
each) and stacks (their fields), all D wide; a dense feature with `embed` is a
stack of its own. `flatten`, `self_attention`, `cin`, `wukong` and
`mask_block` each read exactly one stack; their output is a stack
(self_attention, wukong) or a vector (flatten, cin, mask_block). Sets each
block's op, width and, for a stack output, its number of fields.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from compiler.ir import Cin, Flatten, MaskNet, SelfAttention, Stack, Wukong
from compiler.spec.checker import Checker, known
from compiler.spec.semantic import Features
from compiler.spec.values import (
    ParsedBlock,
    Ref,
    describe,
    is_sequence,
    is_stack,
    kind_name,
    layer_widths,
    value_fields,
    value_width,
)

STACK_BLOCKS = ("stack", "flatten", "self_attention", "cin", "wukong", "mask_block")
_DEFAULTS: dict[str, dict[str, Any]] = {
    "self_attention": {
        "num_layers": 3,
        "num_heads": 2,
        "attention_dim": 32,
        "residual": True,
        "residual_projection": True,
    },
    "cin": {"split_half": True, "bias": False},
    "wukong": {"num_layers": 1, "fmb_layers": [], "activation": "relu"},
    "mask_block": {
        "reduction_ratio": 1.0,
        "layer_norm": True,
        "emb_layer_norm": True,
        "layers": [],
        "emb_norm_scope": "field",
    },
}


def infer_stack_block(checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features) -> None:
    """Set the op, width and (for stack outputs) fields of a stack block, checking its inputs."""
    if block.kind == "stack":
        _stack(checker, block, blocks, features)
        return
    stack = _stack_input(checker, block, blocks, features)
    fields = value_fields(stack, blocks, features) if stack is not None else None
    dim = value_width(stack, blocks, features) if stack is not None else None
    values = {key: checker.value(block.node, key, default) for key, default in _DEFAULTS.get(block.kind, {}).items()}
    if block.kind == "self_attention":
        heads, head_dim = values["num_heads"], values["attention_dim"]
        block.fields = fields
        block.width = heads * head_dim if known(heads, head_dim) else None
        if fields is not None and known(*values.values()) and _identity_fits(checker, block, values, dim):
            block.op = SelfAttention(**values)
    elif block.kind == "wukong":
        _wukong(checker, block, values, fields, dim)
    elif fields is None or dim is None:
        return
    elif block.kind == "flatten":
        block.op, block.width = Flatten(), fields * dim
    elif block.kind == "cin":
        _cin(checker, block, values)
    else:
        _mask_block(checker, block, values, fields * dim)


def _stack(checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features) -> None:
    """A stack of its inputs: no sequences, every input as wide as the most common width."""
    sequences = [ref for ref in block.refs if is_sequence(ref, blocks, features)]
    for ref in sequences:
        message = (
            f"'{ref.text()}' is a sequence {describe(ref, blocks, features)}; a stack block takes vectors and "
            "field stacks: pool it first (sequence_pool or target_attention)"
        )
        checker.error(ref.node, message)
    refs = [ref for ref in block.refs if ref not in sequences]
    widths = {id(ref): value_width(ref, blocks, features) for ref in refs}
    counts = Counter(w for w in widths.values() if w is not None)
    if not counts:
        return
    # The most common width is the stack's; ties go to the first input's.
    order = [w for w in widths.values() if w is not None]
    dim = max(counts, key=lambda w: (counts[w], -order.index(w)))
    agreeing = [ref.text() for ref in refs if widths[id(ref)] == dim]
    others = agreeing[0] if len(agreeing) == 1 else f"{agreeing[0]} and {len(agreeing) - 1} more"
    misfits = [ref for ref in refs if widths[id(ref)] not in (None, dim)]
    for ref in misfits:
        shape = describe(ref, blocks, features)
        message = (
            f"'{ref.text()}' {shape} is {widths[id(ref)]} wide, but the other inputs of this stack are {dim} wide "
            f"({others}); a stack's inputs have one width"
        )
        checker.error(ref.node, message)
    fields = [1 if not is_stack(ref, blocks, features) else value_fields(ref, blocks, features) for ref in refs]
    if sequences or misfits or not block.complete or None in widths.values() or None in fields:
        return
    block.op, block.width, block.fields = Stack(), dim, sum(f for f in fields if f is not None)


def _stack_input(
    checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features
) -> Ref | None:
    """The one field stack the block reads, or None (reported, unless its inputs did not resolve)."""
    at = checker.child(block.node, "input") or block.node
    if not block.complete or not block.refs:
        return None
    if len(block.refs) != 1:
        message = f"{block.kind} reads one field stack (got {len(block.refs)} inputs): stack them first (stack)"
        checker.error(at, message)
        return None
    ref = block.refs[0]
    if not is_stack(ref, blocks, features):
        kind, shape = kind_name(ref, blocks, features), describe(ref, blocks, features)
        hint = "stack it first (stack)" if kind == "a vector" else "pool it and stack it first"
        checker.error(
            ref.node, f"{block.kind} needs a field stack [B, N, D], but '{ref.text()}' is {kind} {shape}: {hint}"
        )
        return None
    return ref if value_width(ref, blocks, features) is not None else None


def _identity_fits(checker: Checker, block: ParsedBlock, values: dict[str, Any], dim: int | None) -> bool:
    """False (reported) when an identity residual's input is not as wide as the layers' output."""
    width = values["num_heads"] * values["attention_dim"]
    if not values["residual"] or values["residual_projection"] or dim is None or dim == width:
        return True
    at = checker.child(block.node, "residual_projection")
    assert at is not None
    message = (
        f"residual_projection: false adds each layer's input to its output, but the stack is {dim} wide and the "
        f"layers' output {width} (num_heads {values['num_heads']} x attention_dim {values['attention_dim']})"
    )
    checker.error(at, message)
    return False


def _cin(checker: Checker, block: ParsedBlock, values: dict[str, Any]) -> None:
    sizes = layer_widths(checker, block, "layer_sizes", None)
    split_half = values["split_half"]
    if sizes is None or not known(split_half):
        return
    if split_half:
        odd = [(i, size) for i, size in enumerate(sizes[:-1]) if size % 2]
        for i, size in odd:
            entry = checker.entries(block.node, "layer_sizes")[i]
            checker.error(entry, f"layer_sizes[{i}] is {size}: with split_half every layer but the last must be even")
        if odd:
            return
        width = sum(size // 2 for size in sizes[:-1]) + sizes[-1]
    else:
        width = sum(sizes)
    block.op, block.width = Cin(tuple(sizes), split_half, values["bias"]), width


def _wukong(checker: Checker, block: ParsedBlock, values: dict[str, Any], fields: int | None, dim: int | None) -> None:
    """Wukong keeps the field width D; its output has num_fmb + num_lcb fields."""
    keys = ("num_fmb", "num_lcb", "rank")
    given = {key: checker.value(block.node, key) for key in keys}
    fmb_layers = layer_widths(checker, block, "fmb_layers", None) if checker.child(block.node, "fmb_layers") else []
    if known(given["num_fmb"], given["num_lcb"]) and None not in (given["num_fmb"], given["num_lcb"]):
        block.fields = given["num_fmb"] + given["num_lcb"]
    block.width = dim
    if fields is None or fmb_layers is None or not known(*given.values(), *values.values()) or None in given.values():
        return
    block.op = Wukong(
        num_layers=values["num_layers"], fmb_layers=tuple(fmb_layers), activation=values["activation"], **given
    )


def _mask_block(checker: Checker, block: ParsedBlock, values: dict[str, Any], flat: int) -> None:
    mode = checker.value(block.node, "mode")
    sizes = layer_widths(checker, block, "block_sizes", None)
    layers = layer_widths(checker, block, "layers", None) if checker.child(block.node, "layers") else []
    if sizes is None or layers is None or not known(mode, *values.values()) or mode is None:
        return
    ratio = values["reduction_ratio"]
    masked = [flat, *sizes[:-1]] if mode == "serial" else [flat]
    narrow = [width for width in masked if round(ratio * width) < 1]
    if narrow:
        at = checker.child(block.node, "reduction_ratio") or block.node
        checker.error(at, f"reduction_ratio {ratio} times the masked width {narrow[0]} leaves no aggregation layer")
        return
    blocks_out = sizes[-1] if mode == "serial" else sum(sizes)
    if values["emb_norm_scope"] != "field" and not values["emb_layer_norm"]:
        at = checker.child(block.node, "emb_norm_scope")
        assert at is not None
        checker.error(at, "emb_norm_scope chooses what emb_layer_norm normalises, but emb_layer_norm is false")
        return
    block.op = MaskNet(
        mode,
        tuple(sizes),
        float(ratio),
        values["layer_norm"],
        values["emb_layer_norm"],
        tuple(layers),
        values["emb_norm_scope"],
    )
    block.width = layers[-1] if layers else blocks_out
