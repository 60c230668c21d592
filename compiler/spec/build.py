"""Build the `ModelIR` from a schema-checked spec: the model DAG, the heads, and the assembly.

Called by `compiler.spec.validate` after the schema pass, with the paths of
the nodes the schema rejected (they are skipped, not re-reported). Resolves
features, tables and settings through `compiler.spec.semantic`, then the
blocks: references (with "did you mean"), cycles (named), a topological
order, output widths and the width rules of each block type, the kind of
every value (a vector, a sequence that only the sequence blocks read, or a
field stack that only `dot`, `fm` and the stack blocks read),
the heads and their losses, and blocks or moe tasks that no head uses.
Returns the IR only when nothing at all was wrong.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import Any

from compiler.diagnostics import Diagnostic
from compiler.ir import (
    Activation,
    Block,
    BlockOp,
    Concat,
    CrossNet,
    Dot,
    DotProduct,
    Fm,
    Head,
    Input,
    Mlp,
    ModelIR,
    Moe,
    Product,
    Sum,
)
from compiler.spec.block_options import head_output, mlp_options, ple_options
from compiler.spec.checker import INVALID, Checker, known, where
from compiler.spec.early_stopping import resolve_early_stopping
from compiler.spec.groups import PREFIX as GROUPS
from compiler.spec.groups import group_members, resolve_groups
from compiler.spec.load import Document, Node, Path
from compiler.spec.lr_plateau import resolve_lr_plateau
from compiler.spec.lr_schedule import resolve_lr_schedule
from compiler.spec.module_names import module_name_clash
from compiler.spec.retrieval import check_keys, check_one, item_ref, retrieval_head
from compiler.spec.semantic import Features, resolve_data, resolve_features, resolve_sharding, resolve_training
from compiler.spec.stacks import STACK_BLOCKS, infer_stack_block
from compiler.spec.values import (
    SEQUENCE_OUTPUTS,
    STACK_OUTPUTS,
    ParsedBlock,
    Ref,
    article,
    describe,
    infer_sequence_block,
    input_ir,
    is_sequence,
    is_stack,
    layer_widths,
    value_fields,
    value_width,
)

METRICS = {"bce": ("ne", "auc", "accuracy"), "mse": ("mse", "rmse"), "softmax": ("accuracy",)}  # the defaults
ALSO_ALLOWED = {"bce": ("log_loss",)}  # metrics a head may ask for beyond its defaults
_MIN_VECTORS = {"dot": 2, "fm": 2, "sum": 2, "product": 2}
SEQUENCE_BLOCKS = ("sequence_pool", "target_attention", "transformer", "hstu", "gru")  # they read a sequence
_SIDE_KEYS = ("query", "prepend", "timestamps")  # references outside `input`


@dataclass(slots=True)
class _Head:
    name: str
    node: Node
    ref: Ref | None
    loss: Any
    label: Any
    item: Ref | None = None  # a sampled_softmax head's item vector


def build_ir(
    doc: Document, tainted: frozenset[Path], world_size: int | None = None
) -> tuple[ModelIR | None, list[Diagnostic]]:
    """Run the semantic checks on `doc`, with `world_size` for the spec's in the checks that depend
    on it (see validate); return its IR (None on any error) and the diagnostics."""
    checker = Checker(tainted)
    root = doc.root
    assert root is not None
    features = resolve_features(checker, root)
    features.groups = resolve_groups(checker, root, features)
    blocks = _parse_blocks(checker, root, features)
    heads = _parse_heads(checker, root, blocks, features)
    order = _order(checker, blocks)
    readers: dict[str, dict[str, Any]] = {}  # block -> {head reading it: its `output` (None: a retrieval vector)}
    for head in heads:
        for ref in (head.ref, head.item):
            if ref is not None and ref.kind == "block":
                output = checker.value(head.node, "output", "logit") if ref is head.ref else None
                readers.setdefault(ref.name, {})[head.name] = output
    for name in order:
        _infer(checker, blocks[name], blocks, features, readers.get(name))
    heads_ir = [_head_ir(checker, head, blocks, features, readers) for head in heads]
    _check_unused(checker, blocks, heads)
    sharding = resolve_sharding(checker, root, features.table_names, world_size)
    # The batch over the spec's ranks; over the command line's, apply_options checks it with the
    # command line's batch size too.
    spec_world = checker.value(checker.child(root, "sharding"), "world_size", 1) if world_size is None else None
    training = resolve_training(checker, root, spec_world)
    lr_schedule = resolve_lr_schedule(checker, checker.child(root, "training"))
    early_stopping = resolve_early_stopping(checker, checker.child(root, "training"), heads_ir)
    lr_plateau = resolve_lr_plateau(checker, checker.child(root, "training"), heads_ir)
    labels = {head.label for head in heads if isinstance(head.label, str) and head.loss != "sampled_softmax"}
    targets = set(features.dense_sizes) | set(features.sparse_dims) | features.timestamps_names | labels
    data = resolve_data(checker, root, targets)
    name, version = checker.value(root, "name"), checker.value(root, "version")
    resolved = (sharding, training, lr_schedule, early_stopping, lr_plateau, data, name, version)
    complete = known(*resolved) and None not in heads_ir
    if tainted or checker.diagnostics or not complete:
        return None, checker.diagnostics
    ir_blocks = tuple(_block_ir(blocks[name], blocks, features) for name in order)
    return (
        ModelIR(
            version=version,
            name=name,
            source=doc.path,
            source_sha256=doc.sha256,
            dense=tuple(features.dense),
            sparse=tuple(features.sparse),
            # Each table's optimizer resolved here, once: its own, else the training section's.
            tables=tuple(
                dataclasses.replace(t, optimizer=t.optimizer or training.sparse_optimizer) for t in features.tables
            ),
            blocks=ir_blocks,
            heads=tuple(h for h in heads_ir if h is not None),
            training=dataclasses.replace(
                training, lr_schedule=lr_schedule, early_stopping=early_stopping, lr_plateau=lr_plateau
            ),
            sharding=sharding,
            data=data,
            loc=root.loc,
            timestamps=tuple(features.timestamps),
        ),
        [],
    )


def _parse_blocks(checker: Checker, root: Node, features: Features) -> dict[str, ParsedBlock]:
    blocks = {
        name: ParsedBlock(name, node, checker.value(node, "type"), []) for name, node in checker.pairs(root, "model")
    }
    for block in blocks.values():
        clash = module_name_clash(block.name, features.dense_sizes)
        if clash is not None:
            checker.error(block.node, f"block name '{block.name}' is {clash}; rename the block", at_key=True)
        field = checker.child(block.node, "input")
        if field is None or field.path in checker.tainted:
            continue
        items = field.value if field.is_sequence else [field]
        refs = [ref for item in items for ref in _resolve(checker, item, features, blocks)]
        block.refs = _dedupe(checker, [ref for ref in refs if ref.kind])
        block.complete = all(ref.kind for ref in refs)
        if block.kind in SEQUENCE_BLOCKS:
            _parse_side(checker, block, features, blocks)
    return blocks


def _parse_side(checker: Checker, block: ParsedBlock, features: Features, blocks: dict[str, ParsedBlock]) -> None:
    """The references a sequence block takes beside `input`: query, prepend, timestamps."""
    if block.kind not in SEQUENCE_BLOCKS:
        return  # no such keys on other types; without a type the schema could not check them
    for key in _SIDE_KEYS:
        field_node = checker.child(block.node, key)
        if field_node is None or field_node.path in checker.tainted:
            block.side_complete = block.side_complete and (field_node is None)
            continue
        items = field_node.value if field_node.is_sequence else [field_node]
        refs = []
        for item in items:
            if not isinstance(item.value, str):
                block.side_complete = False  # the schema reports it
            elif key == "timestamps":
                refs.append(_resolve_timestamps(checker, item, features))
            elif item.value == "sparse.*":
                checker.error(item, f"{key} names vectors one by one; 'sparse.*' names every pooled feature")
                refs.append(Ref("", item.value, None, item))
            else:
                refs.extend(_resolve(checker, item, features, blocks))
        block.side[key] = [ref for ref in refs if ref.kind]
        block.side_complete = block.side_complete and all(ref.kind for ref in refs)


def _resolve_timestamps(checker: Checker, item: Node, features: Features) -> Ref:
    kind, _, name = item.value.partition(".")
    if kind != "timestamps" or not name:
        checker.error(item, f"'{item.value}' is not a timestamps reference: expected timestamps.<name>")
        return Ref("", item.value, None, item)
    if name not in features.timestamps_names:
        checker.error(item, f"unknown timestamps feature '{name}'{checker.suggest(name, features.timestamps_names)}")
        return Ref("", item.value, None, item)
    return Ref("timestamps", name, None, item)


def _dedupe(checker: Checker, refs: list[Ref]) -> list[Ref]:
    seen: dict[tuple[str, str, str | None], Ref] = {}
    for ref in refs:
        key = (ref.kind, ref.name, ref.port)
        if key in seen:
            nodes = (seen[key].node, ref.node)
            wide = [n.value for n in nodes if n.value == "sparse.*" or n.value.startswith(f"{GROUPS}.")]
            via = f" ({wide[0]} includes it)" if wide else ""
            checker.error(ref.node, f"'{ref.text()}' is already an input of this block{via}")
        else:
            seen[key] = ref
    return list(seen.values())


def _resolve(checker: Checker, item: Node, features: Features, blocks: dict[str, ParsedBlock]) -> list[Ref]:
    """The references one input string stands for; a bad one is reported and gives `kind=''`."""
    text: str = item.value
    parts = text.split(".")
    bad = [Ref("", text, None, item)]
    if parts[0] in ("dense", "sparse") and len(parts) == 2 and parts[1]:
        return _resolve_feature(checker, item, parts[0], parts[1], features) or bad
    if parts[0] == GROUPS and parts[0] not in blocks and len(parts) == 2 and parts[1]:
        members = group_members(checker, item, features.groups)
        return [Ref(kind, name, None, item) for kind, name in members] if members else bad
    if parts[0] == "timestamps" and parts[0] not in blocks:
        checker.error(item, f"'{text}' is a timestamps feature: only an hstu block reads it, as its `timestamps`")
        return bad
    if parts[0] not in ("dense", "sparse") and len(parts) <= 2 and all(parts):
        return _resolve_block(checker, item, blocks, features) or bad
    expected = "dense.<feature>, sparse.<feature>, sparse.*, <block> or <block>.<task>"
    checker.error(item, f"'{text}' is not a reference: expected {expected}")
    return bad


def _resolve_feature(checker: Checker, item: Node, kind: str, name: str, features: Features) -> list[Ref]:
    if kind == "sparse" and name == "*":
        pooled = [feature for feature in features.sparse_dims if feature not in features.sequence_lengths]
        if not features.sparse_dims:
            checker.error(item, "sparse.* names no features: the spec has no sparse features")
        elif not pooled:
            checker.error(item, "sparse.* names no features: every sparse feature is a sequence (pooling: none)")
        return [Ref("sparse", feature, None, item) for feature in pooled]
    names = features.dense_sizes if kind == "dense" else features.sparse_dims
    if name in names:
        return [Ref(kind, name, None, item)]
    other = "sparse" if kind == "dense" else "dense"
    others = features.sparse_dims if kind == "dense" else features.dense_sizes
    if name in others:
        hint = f" ('{name}' is a {other} feature: {other}.{name})"
    elif "*" in name:
        hint = " (the only wildcard is sparse.*, every sparse feature)"
    elif name in features.counted and kind == "sparse":
        hint = f" ('{name}' has a count: use {kind}.{name}_0, {kind}.{name}_1, ... or sparse.*)"
    else:
        hint = checker.suggest(name, names)
    checker.error(item, f"unknown {kind} feature '{name}'{hint}")
    return []


def _resolve_block(checker: Checker, item: Node, blocks: dict[str, ParsedBlock], features: Features) -> list[Ref]:
    """`<block>` or `<block>.<task>` (the text of `item`), checked against the block's outputs."""
    name, _, task = item.value.partition(".")
    port = task or None
    block = blocks.get(name)
    if block is None:
        if name in features.dense_sizes or name in features.sparse_dims:
            kind = "dense" if name in features.dense_sizes else "sparse"
            hint = f" ('{name}' is a feature: {kind}.{name})"
        else:
            hint = checker.suggest(name, blocks)
        checker.error(item, f"unknown block '{name}'{hint}")
        return []
    tasks = _tasks(checker, block)
    if block.kind == "moe" and port is None:
        choices = _either([f"{name}.{task}" for task in tasks]) if tasks else f"{name}.<task>"
        checker.error(item, f"block '{name}' is a moe block with one output per task: use {choices}")
        return []
    if port is not None and isinstance(block.kind, str) and block.kind != "moe":
        message = f"block '{name}' is {article(block.kind)} block with a single output; '{item.value}' names no task"
        checker.error(item, message)
        return []
    if port is not None and tasks and port not in tasks:
        hint = checker.suggest(port, tasks)
        message = f"moe block '{name}' has no task '{port}'{hint}; its tasks: {', '.join(tasks)}"
        checker.error(item, message)
        return []
    return [Ref("block", name, port, item)]


def _either(choices: list[str]) -> str:
    return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]


def _tasks(checker: Checker, block: ParsedBlock) -> list[str]:
    tasks = checker.value(block.node, "tasks") if block.kind == "moe" else None
    return tasks if isinstance(tasks, list) else []


def _parse_heads(checker: Checker, root: Node, blocks: dict[str, ParsedBlock], features: Features) -> list[_Head]:
    heads: list[_Head] = []
    names: dict[str, Node] = {}
    check_one(checker, checker.entries(root, "heads"))
    for entry in checker.entries(root, "heads"):
        name = checker.name(entry)
        name_node = checker.child(entry, "name") or entry
        if name is None:
            continue
        if name in names:
            checker.error(name_node, f"duplicate head name '{name}' (also at {where(names[name])})")
            continue
        names[name] = name_node
        if name in blocks:
            checker.error(name_node, f"head '{name}' has the name of a block; blocks and heads need distinct names")
        ref = _head_ref(checker, entry, blocks, features)
        loss = checker.value(entry, "loss")
        check_keys(checker, entry, loss)
        item = _item(checker, entry, blocks, features) if loss == "sampled_softmax" else None
        heads.append(_Head(name, entry, ref, loss, checker.value(entry, "label", name), item))
    return heads


def _item(checker: Checker, entry: Node, blocks: dict[str, ParsedBlock], features: Features) -> Ref | None:
    """A sampled_softmax head's `item`: a block or a sparse feature."""
    node = checker.child(entry, "item")
    refs = None if node is None or node.path in checker.tainted else _resolve(checker, node, features, blocks)
    return item_ref(checker, entry, refs)


def _head_ref(checker: Checker, entry: Node, blocks: dict[str, ParsedBlock], features: Features) -> Ref | None:
    item = checker.child(entry, "input")
    if item is None or item.path in checker.tainted:
        return None
    text: str = item.value
    parts = text.split(".")
    if parts[0] in ("dense", "sparse"):
        checker.error(item, f"a head reads a block's output, not a feature; add a block that reads '{text}'")
        return None
    if len(parts) > 2 or not all(parts):
        checker.error(item, f"'{text}' is not a block reference: expected <block> or <block>.<task>")
        return None
    refs = _resolve_block(checker, item, blocks, features)
    return refs[0] if refs else None


def _order(checker: Checker, blocks: dict[str, ParsedBlock]) -> list[str]:
    """Report every cycle; return the acyclic blocks in a topological order (ties: declaration order)."""
    deps = {name: _block_deps(block, blocks) for name, block in blocks.items()}
    index = {name: i for i, name in enumerate(blocks)}
    for cycle in _cycles(deps):
        _report_cycle(checker, cycle, blocks, index)
    waiting = {name: len(set(d)) for name, d in deps.items()}
    readers: dict[str, list[str]] = {name: [] for name in blocks}
    for name, d in deps.items():
        for dep in set(d):
            readers[dep].append(name)
    ready = [(index[name], name) for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(name)
        for reader in readers[name]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (index[reader], reader))
    return order


def _block_deps(block: ParsedBlock, blocks: dict[str, ParsedBlock]) -> list[str]:
    names = [ref.name for ref in block.all_refs() if ref.kind == "block" and ref.name in blocks]
    return list(dict.fromkeys(names))


def _cycles(deps: dict[str, list[str]]) -> list[list[str]]:
    """Cycles found by an iterative depth-first search, each as [a, b, ..., a] where a reads b.

    One cycle per back edge, and none through a block already in a reported
    cycle: every cycle is named, without one diagnostic per path through it.
    """
    depth: dict[str, int] = {}  # position on the current path; -1 once finished
    in_cycle: set[str] = set()
    cycles: list[list[str]] = []
    for start in deps:
        if start in depth:
            continue
        depth[start] = 0
        path, stack = [start], [iter(deps[start])]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                depth[path.pop()] = -1
                stack.pop()
            elif nxt not in depth:
                depth[nxt] = len(path)
                path.append(nxt)
                stack.append(iter(deps[nxt]))
            elif depth[nxt] >= 0 and nxt not in in_cycle:
                cycle = path[depth[nxt] :]
                in_cycle.update(cycle)
                cycles.append(cycle + [nxt])
    return cycles


def _report_cycle(checker: Checker, cycle: list[str], blocks: dict[str, ParsedBlock], index: dict[str, int]) -> None:
    """Name the cycle in data-flow order, from (and at) its first declared block."""
    flow = list(reversed(cycle[:-1]))  # data flows from an input to its reader
    first = min(range(len(flow)), key=lambda i: index[flow[i]])
    flow = flow[first:] + flow[:first]
    block = blocks[flow[0]]
    at = checker.child(block.node, "input") or block.node
    if len(flow) == 1:
        checker.error(at, f"block '{block.name}' reads its own output")
    else:
        checker.error(at, "cycle in the model: " + " -> ".join(flow + [flow[0]]))


def _infer(
    checker: Checker,
    block: ParsedBlock,
    blocks: dict[str, ParsedBlock],
    features: Features,
    readers: dict[str, Any] | None,
) -> None:
    """Set the block's op and output width, checking its type's input rules; `readers`: see `_mlp`."""
    kind = block.kind
    if not isinstance(kind, str):
        return
    if kind in SEQUENCE_BLOCKS:
        infer_sequence_block(checker, block, blocks, features)
        return
    if kind in STACK_BLOCKS:
        infer_stack_block(checker, block, blocks, features)
        return
    sequences = [ref for ref in block.refs if is_sequence(ref, blocks, features)]
    if sequences and not isinstance(kind, str):  # no valid type (the schema said so): nothing to check against
        block.width = None
        return
    for ref in sequences:
        message = (
            f"'{ref.text()}' is a sequence {describe(ref, blocks, features)}; {article(kind)} block takes vectors: "
            "pool it first (sequence_pool or target_attention)"
        )
        checker.error(ref.node, message)
    stacks = [ref for ref in block.refs if is_stack(ref, blocks, features)] if kind not in ("dot", "fm") else []
    for ref in stacks:
        message = (
            f"'{ref.text()}' is a field stack {describe(ref, blocks, features)}; {article(kind)} block takes "
            "vectors: flatten it first (flatten)"
        )
        checker.error(ref.node, message)
    if sequences or stacks:
        block.width = 1 if kind in ("fm", "dot_product") else None
        return
    widths = [value_width(ref, blocks, features) for ref in block.refs]
    # dot and fm read a field stack as its N vectors
    fields = [value_fields(ref, blocks, features) if is_stack(ref, blocks, features) else 1 for ref in block.refs]
    count = sum(f for f in fields if f is not None) if None not in fields else None
    total = sum(w for w in widths if w is not None) if block.complete and None not in widths else None
    if kind == "mlp":
        block.op, block.width = _mlp(checker, block, total, readers)
    elif kind == "moe":
        block.op, block.width = _moe(checker, block, total)
    elif kind == "crossnet":
        num_layers, low_rank = checker.value(block.node, "num_layers"), checker.value(block.node, "low_rank")
        block.width = total
        block.op = CrossNet(num_layers, low_rank) if known(num_layers, low_rank) and num_layers else None
    elif kind == "concat":
        block.op, block.width = Concat(), total
    elif kind == "activation":
        fn = checker.value(block.node, "fn")
        block.op, block.width = (Activation(fn) if known(fn) and fn else None), total
    elif kind in ("fm", "dot_product"):
        # a scalar per sample, whatever the inputs: known even when they are broken
        output = checker.value(block.node, "output", "sum") if kind == "fm" else "sum"
        block.width = 1 if output == "sum" else None
        width = _vectorvalue_width(checker, block, widths, count)
        if width is not None and known(output):
            block.op = Fm(output) if kind == "fm" else DotProduct()
            block.width = 1 if output == "sum" else width
    elif kind in ("dot", "sum", "product"):
        width = _vectorvalue_width(checker, block, widths, count)
        if width is not None and count is not None:
            pairs = count * (count - 1) // 2
            ops = {"dot": (Dot(), width + pairs), "sum": (Sum(), width), "product": (Product(), width)}
            block.op, block.width = ops[kind]


def _mlp(
    checker: Checker, block: ParsedBlock, total: int | None, readers: dict[str, Any] | None
) -> tuple[BlockOp | None, int | None]:
    """`readers`: the heads reading the block and their `output`, if any (its final activation's default:
    sigmoid when they all read a probability, else none: a logit, or a retrieval vector)."""
    layers = layer_widths(checker, block, "layers", total)
    activation = checker.value(block.node, "activation", "relu")
    if not readers:
        final_default = activation
    else:
        final_default = "sigmoid" if set(readers.values()) == {"probability"} else "none"
    final = checker.value(block.node, "final_activation", final_default)
    if layers is None:
        return None, None
    options = mlp_options(checker, block, layers, final)
    op = Mlp(tuple(layers), activation, final, **options) if known(activation, final, options) else None
    return op, layers[-1]


def _moe(checker: Checker, block: ParsedBlock, total: int | None) -> tuple[BlockOp | None, int | None]:
    layers = layer_widths(checker, block, "expert_layers", total)
    experts, tasks = checker.value(block.node, "num_experts"), checker.value(block.node, "tasks")
    activation = checker.value(block.node, "activation", "relu")
    if layers is None:
        return None, None
    ple = ple_options(checker, block, experts, layers)
    if not (known(experts, tasks, activation, ple) and experts and tasks):
        return None, layers[-1]
    per_level = ple[2]
    return Moe(experts, tuple(layers), tuple(tasks), activation, *ple), per_level[-1][2][-1] if per_level else layers[
        -1
    ]


def _vectorvalue_width(checker: Checker, block: ParsedBlock, widths: list[int | None], count: int | None) -> int | None:
    """The common width of the input vectors of dot / fm / dot_product / sum, or None.

    Unequal widths among the inputs that resolved are reported even when others
    did not; the count of vectors (a field stack's fields each count) only when
    all of them resolved.
    """
    at = checker.child(block.node, "input") or block.node
    kind = block.kind
    groups: dict[int, list[str]] = {}
    for ref, width in zip(block.refs, widths):
        if width is not None:
            groups.setdefault(width, []).append(ref.text())
    if len(groups) > 1:
        listed = ", ".join(f"{width} ({_summary(refs)})" for width, refs in groups.items())
        checker.error(at, f"{kind} needs inputs of equal width, got {listed}")
        return None
    if not block.complete or count is None:
        return None
    if kind == "dot_product" and count != 2:
        checker.error(at, f"dot_product needs exactly two inputs (got {count})")
        return None
    if count < _MIN_VECTORS.get(kind, 0):
        checker.error(at, f"{kind} needs at least two input vectors (got {count})")
        return None
    return next(iter(groups)) if len(groups) == 1 and None not in widths else None


def _summary(refs: list[str]) -> str:
    return refs[0] if len(refs) == 1 else f"{refs[0]} and {len(refs) - 1} more"


def _head_ir(
    checker: Checker,
    head: _Head,
    blocks: dict[str, ParsedBlock],
    features: Features,
    readers: dict[str, dict[str, Any]],
) -> Head | None:
    if head.loss == "sampled_softmax":
        if head.ref is None or head.item is None:
            return None
        return retrieval_head(checker, head.node, head.name, head.ref, head.item, blocks, features)
    label = checker.value(head.node, "label", head.name)
    weight = checker.value(head.node, "weight", 1.0)
    metrics = _metrics(checker, head)
    block = blocks[head.ref.name] if head.ref is not None else None
    output = head_output(checker, head.node, head.loss, block, readers.get(block.name, {}) if block else {})
    width = blocks[head.ref.name].width if head.ref is not None else None
    if head.ref is not None and blocks[head.ref.name].kind in SEQUENCE_OUTPUTS:
        text = f"'{head.ref.text()}' is a sequence {describe(head.ref, blocks, features)}"
        checker.error(head.ref.node, f"a head reads a vector, but {text}: pool it first (sequence_pool)")
        return None
    if head.ref is not None and blocks[head.ref.name].kind in STACK_OUTPUTS:
        text = f"'{head.ref.text()}' is a field stack {describe(head.ref, blocks, features)}"
        checker.error(head.ref.node, f"a head reads a vector, but {text}: flatten it first (flatten)")
        return None
    if head.ref is None or width is None or not known(head.loss, label, weight, metrics, output):
        return None
    source = f"'{head.ref.text()}' is {width} wide"
    if head.loss in ("bce", "mse") and width != 1:
        checker.error(head.ref.node, f"{article(head.loss)} head needs a 1-wide input, but {source}")
        return None
    if head.loss == "softmax" and width < 2:
        checker.error(head.ref.node, f"a softmax head needs one logit per class (at least 2), but {source}")
        return None
    num_classes = width if head.loss == "softmax" else 1
    ref = Input("block", head.ref.name, width, head.ref.port)
    return Head(
        head.name, ref, head.loss, label, float(weight), num_classes, tuple(metrics), head.node.loc, output=output
    )


def _metrics(checker: Checker, head: _Head) -> Any:
    """The head's metrics (defaults by loss), INVALID if one does not fit the loss."""
    metrics = checker.value(head.node, "metrics")
    if head.loss not in METRICS or not known(metrics):
        return INVALID
    if metrics is None:
        return list(METRICS[head.loss])
    allowed = METRICS[head.loss] + ALSO_ALLOWED.get(head.loss, ())
    misfits = [item for item in checker.entries(head.node, "metrics") if item.value not in allowed]
    for item in misfits:
        message = f"metric '{item.value}' does not apply to {article(head.loss)} head (allowed: {', '.join(allowed)})"
        checker.error(item, message)
    return INVALID if misfits else metrics


def _check_unused(checker: Checker, blocks: dict[str, ParsedBlock], heads: list[_Head]) -> None:
    """Every block must lead to a head, and every task of a used moe block must be read."""
    used: set[str] = set()
    ports: set[tuple[str, str | None]] = set()
    stack = [ref for head in heads for ref in (head.ref, head.item) if ref is not None and ref.kind == "block"]
    while stack:
        ref = stack.pop()
        ports.add((ref.name, ref.port))
        if ref.name not in used:
            used.add(ref.name)
            stack.extend(r for r in blocks[ref.name].all_refs() if r.kind == "block")
    broken = any(head.ref is None or (head.loss == "sampled_softmax" and head.item is None) for head in heads) or any(
        not (blocks[name].complete and blocks[name].side_complete) for name in used
    )
    if broken or not heads:
        return  # a broken reference may be the missing reader
    for block in blocks.values():
        if block.name not in used and isinstance(block.kind, str):
            message = f"block '{block.name}' does not lead to any head; it would be silently dead"
            checker.error(block.node, message, at_key=True)
        elif block.kind == "moe":
            for item in checker.entries(block.node, "tasks"):
                if item.path not in checker.tainted and (block.name, item.value) not in ports:
                    message = f"task '{item.value}' of moe block '{block.name}' is not read by any block or head"
                    checker.error(item, message)


def _block_ir(block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features) -> Block:
    assert block.op is not None and block.width is not None
    inputs = tuple(input_ir(ref, blocks, features) for ref in block.refs)
    loc = block.node.key_loc or block.node.loc
    return Block(block.name, block.op, inputs, block.width, loc, block.length, block.fields)
