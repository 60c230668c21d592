"""The values of the model DAG while it is built: parsed references and blocks, and their kinds.

Used by `compiler.spec.build`. A value is a vector [B, W], a sequence
[B, <= L, D] with its lengths (a sparse feature with `pooling: none`, or the
output of a transformer or hstu block) or a field stack [B, N, D] (a dense
feature with `embed`, or the output of a stack, self_attention or wukong
block). This module says which a reference is, describes it for messages, and checks the four sequence blocks
(sequence_pool, target_attention, transformer, hstu): each reads exactly one
sequence, and its side inputs (query, prepend, timestamps) fit that sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compiler.ir import AuxLoss, BlockOp, Gru, Hstu, Input, SequencePool, TargetAttention, Transformer
from compiler.spec.checker import INVALID, Checker, known
from compiler.spec.load import Node
from compiler.spec.semantic import FLOAT_BYTES, INT64_MAX, Features

SEQUENCE_OUTPUTS = ("transformer", "hstu", "gru")  # the blocks whose output is a sequence
STACK_OUTPUTS = ("stack", "self_attention", "wukong")  # the blocks whose output is a field stack
DEFAULT_HIDDEN = [80, 40]  # DIN's attention MLP


@dataclass(frozen=True, slots=True)
class Ref:
    """One input reference after `sparse.*` expansion."""

    kind: str  # dense | sparse | block | timestamps
    name: str
    port: str | None
    node: Node

    def text(self) -> str:
        if self.kind == "block":
            return self.name if self.port is None else f"{self.name}.{self.port}"
        return f"{self.kind}.{self.name}"


@dataclass(slots=True)
class ParsedBlock:
    name: str
    node: Node
    kind: Any  # the block type, None if missing, INVALID if rejected
    refs: list[Ref]  # the inputs that resolved
    complete: bool = False  # every input resolved
    width: int | None = None
    op: BlockOp | None = None
    side: dict[str, list[Ref]] = field(default_factory=dict)  # query / prepend / timestamps, resolved
    side_complete: bool = True
    length: int | None = None  # of a sequence output
    origin: str | None = None  # the sparse feature whose positions a sequence output has
    fields: int | None = None  # of a field stack output

    def all_refs(self) -> list[Ref]:
        return self.refs + [ref for refs in self.side.values() for ref in refs]


def article(word: str) -> str:
    """`word` with its indefinite article, as the word is spoken (`an mlp`, `a moe`)."""
    spoken_vowel = word[0] in "aeio" or word in ("mlp", "mse", "fm")
    return ("an " if spoken_vowel else "a ") + word


def value_width(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> int | None:
    if ref.kind == "dense":
        if ref.name in features.dense_embed_dims:
            return features.dense_embed_dims[ref.name]
        return features.dense_sizes.get(ref.name)
    if ref.kind == "sparse":
        return features.sparse_dims.get(ref.name)
    return blocks[ref.name].width


def layer_widths(checker: Checker, block: ParsedBlock, key: str, total: int | None) -> list[int] | None:
    """A list of layer widths, checking that each weight matrix's byte size fits in int64."""
    layers = checker.value(block.node, key)
    if not isinstance(layers, list):
        return None
    sizes = ([total] if total is not None else []) + layers
    offset = 0 if total is not None else 1
    for i in range(1, len(sizes)):
        if sizes[i - 1] * sizes[i] * FLOAT_BYTES > INT64_MAX:
            layer = checker.entries(block.node, key)[i - 1 + offset]
            checker.error(layer, f"a {sizes[i - 1]} x {sizes[i]} weight matrix needs more than 2**63 bytes")
            return None
    return layers


def is_sequence(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> bool:
    if ref.kind == "sparse":
        return ref.name in features.sequence_lengths
    return ref.kind == "block" and blocks[ref.name].kind in SEQUENCE_OUTPUTS


def is_stack(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> bool:
    if ref.kind == "dense":
        return ref.name in features.dense_embed_dims
    return ref.kind == "block" and blocks[ref.name].kind in STACK_OUTPUTS


def value_fields(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> int | None:
    """The number of fields N of a field stack [B, N, D] (None for other values, or when not known)."""
    if ref.kind == "dense":
        return features.dense_sizes.get(ref.name) if ref.name in features.dense_embed_dims else None
    return blocks[ref.name].fields if ref.kind == "block" else None


def value_length(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> int | None:
    """The longest sequence `ref` gives (None for a vector, or when not known)."""
    if ref.kind == "sparse":
        return features.sequence_lengths.get(ref.name)
    return blocks[ref.name].length if ref.kind == "block" else None


def describe(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> str:
    """The value's shape as messages show it: `[B, <=50, 64]`, `[B, 26, 16]` (a stack) or `[B, 64]`."""
    width = value_width(ref, blocks, features)
    width_text = "?" if width is None else str(width)
    if is_stack(ref, blocks, features):
        fields = value_fields(ref, blocks, features)
        return f"[B, {'?' if fields is None else fields}, {width_text}]"
    if not is_sequence(ref, blocks, features):
        return f"[B, {width_text}]"
    length = value_length(ref, blocks, features)
    return f"[B, <={'?' if length is None else length}, {width_text}]"


def kind_name(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> str:
    """`a vector`, `a sequence` or `a field stack`, for messages."""
    if is_stack(ref, blocks, features):
        return "a field stack"
    return "a sequence" if is_sequence(ref, blocks, features) else "a vector"


def input_ir(ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> Input:
    width = value_width(ref, blocks, features)
    assert width is not None
    length = value_length(ref, blocks, features) if is_sequence(ref, blocks, features) else None
    fields = value_fields(ref, blocks, features) if is_stack(ref, blocks, features) else None
    return Input(ref.kind, ref.name, width, ref.port, length, fields)  # type: ignore[arg-type]


def infer_sequence_block(
    checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features
) -> None:
    """Set the op, width and (for sequence outputs) length of a sequence block, checking its inputs."""
    sequence = _sequence_input(checker, block, blocks, features)
    width = value_width(sequence, blocks, features) if sequence is not None else None
    length = value_length(sequence, blocks, features) if sequence is not None else None
    block.width = width
    if block.kind == "sequence_pool":
        mode = checker.value(block.node, "mode", "mean")
        if sequence is not None and known(mode):
            block.op = SequencePool(mode)
    elif block.kind == "target_attention":
        sequences = _joined_sequences(checker, block, blocks, features) if len(block.refs) > 1 else [sequence]
        if sequences is not None and None not in sequences and len(sequences) > 1:
            widths = [value_width(ref, blocks, features) for ref in sequences]  # type: ignore[arg-type]
            block.width = None if None in widths else sum(widths)  # type: ignore[arg-type]
        block.op = _target_attention(checker, block, blocks, features, sequences)  # type: ignore[arg-type]
    elif block.kind == "transformer":
        block.op = _transformer(checker, block, blocks, features, sequence)
        if isinstance(block.op, Transformer) and width is not None:
            block.width = width + block.op.position_dim
        prepended = len(block.side.get("prepend", []))
        block.length = None if length is None else length + prepended
        block.origin = _origin(sequence, blocks) if sequence is not None and not prepended else None
    elif block.kind == "gru":
        block.op = _gru(checker, block, blocks, features, sequence)
        block.width = checker.value(block.node, "hidden_size", width)
        block.width = block.width if known(block.width) else None
        block.length = length
        block.origin = _origin(sequence, blocks) if sequence is not None else None
    else:
        block.op = _hstu(checker, block, blocks, features, sequence)
        block.length = length
        block.origin = _origin(sequence, blocks) if sequence is not None else None


def _sequence_input(
    checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features
) -> Ref | None:
    """The one sequence the block reads, or None (reported, unless its inputs did not resolve)."""
    at = checker.child(block.node, "input") or block.node
    if not block.complete or not block.refs:
        return None
    if len(block.refs) != 1:
        if block.kind != "target_attention":  # which joins several (_joined_sequences)
            checker.error(at, f"{block.kind} reads one sequence (got {len(block.refs)} inputs)")
        return None
    ref = block.refs[0]
    if not is_sequence(ref, blocks, features):
        shape, kind = describe(ref, blocks, features), kind_name(ref, blocks, features)
        checker.error(ref.node, f"{block.kind} needs a sequence, but '{ref.text()}' is {kind} {shape}")
        return None
    return ref if value_width(ref, blocks, features) is not None else None


def _joined_sequences(
    checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features
) -> list[Ref] | None:
    """The sequence fields a target_attention joins position by position, all of one max_length; None (reported)."""
    if not block.complete:
        return None
    misfits = [ref for ref in block.refs if not is_sequence(ref, blocks, features)]
    for ref in misfits:
        shape, kind = describe(ref, blocks, features), kind_name(ref, blocks, features)
        checker.error(ref.node, f"target_attention needs sequences, but '{ref.text()}' is {kind} {shape}")
    if misfits:
        return None
    lengths = [value_length(ref, blocks, features) for ref in block.refs]
    if len(set(lengths)) > 1:
        listed = ", ".join(f"'{ref.text()}' {length}" for ref, length in zip(block.refs, lengths))
        message = (
            f"target_attention joins its sequences position by position, so they need one max_length (got {listed})"
        )
        checker.error(checker.child(block.node, "input") or block.node, message)
        return None
    return list(block.refs) if None not in [value_width(ref, blocks, features) for ref in block.refs] else None


def _origin(sequence: Ref, blocks: dict[str, ParsedBlock]) -> str | None:
    return sequence.name if sequence.kind == "sparse" else blocks[sequence.name].origin


def _vector_of_width(
    checker: Checker,
    ref: Ref,
    role: str,
    sequence: Ref,
    blocks: dict[str, ParsedBlock],
    features: Features,
) -> Input | None:
    """`ref` as an Input if it is a vector as wide as `sequence`; reported otherwise."""
    shape = describe(ref, blocks, features)
    if is_sequence(ref, blocks, features) or is_stack(ref, blocks, features):
        kind = kind_name(ref, blocks, features)
        checker.error(ref.node, f"{role} must be a vector, but '{ref.text()}' is {kind} {shape}")
        return None
    width, wanted = value_width(ref, blocks, features), value_width(sequence, blocks, features)
    if width is None:
        return None
    if width != wanted:
        message = (
            f"{role} '{ref.text()}' is {width} wide but the sequence '{sequence.text()}' is {wanted} wide; "
            "they must be equal"
        )
        checker.error(ref.node, message)
        return None
    return input_ir(ref, blocks, features)


def _target_attention(
    checker: Checker,
    block: ParsedBlock,
    blocks: dict[str, ParsedBlock],
    features: Features,
    sequences: list[Ref] | None,
) -> BlockOp | None:
    hidden = layer_widths(checker, block, "hidden", None) if checker.child(block.node, "hidden") else DEFAULT_HIDDEN
    activation = checker.value(block.node, "activation", "sigmoid")
    normalize = checker.value(block.node, "normalize", "none")
    queries = block.side.get("query", [])
    if not sequences or None in sequences or not queries or not block.side_complete:
        return None  # an input that did not resolve is reported where it is named
    if len(queries) != len(sequences):
        at = checker.child(block.node, "query") or block.node
        message = (
            f"target_attention joins {len(sequences)} sequences position by position, so its query lists "
            f"{len(sequences)} vectors, one per sequence (got {len(queries)})"
        )
        checker.error(at, message)
        return None
    role = "the query" if len(queries) == 1 else "a query field"
    fields = [
        _vector_of_width(checker, ref, role, sequence, blocks, features) for ref, sequence in zip(queries, sequences)
    ]
    if None in fields or hidden is None or not known(activation, normalize):
        return None
    return TargetAttention(fields[0], tuple(hidden), activation, normalize, tuple(fields[1:]))  # type: ignore[arg-type]


def _transformer(
    checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features, sequence: Ref | None
) -> BlockOp | None:
    keys = (
        "num_layers",
        "num_heads",
        "ffn_dim",
        "norm",
        "causal",
        "positions",
        "activation",
        "norm_affine",
        "scale_input",
        "dropout",
        "input_dropout",
    )
    defaults = {
        "num_layers": 1,
        "norm": "post",
        "causal": False,
        "positions": "learned",
        "activation": "relu",
        "norm_affine": True,
        "scale_input": False,
        "dropout": 0.0,
        "input_dropout": 0.0,
    }
    values = {key: checker.value(block.node, key, defaults.get(key)) for key in keys}
    position_dim = _position_dim(checker, block, values["positions"])
    if sequence is None or position_dim is None:
        return None
    width = value_width(sequence, blocks, features)
    prepend = [
        _vector_of_width(checker, ref, "prepend", sequence, blocks, features) for ref in block.side.get("prepend", [])
    ]
    heads = values["num_heads"]
    if isinstance(heads, int) and width is not None and (width + position_dim) % heads:
        at = checker.child(block.node, "num_heads") or block.node
        if position_dim:
            what = f"the sequence width {width} plus position_dim {position_dim}"
        else:
            what = f"the sequence width {width}"
        checker.error(at, f"{what} is not divisible by num_heads {heads}")
        return None
    if None in prepend or not block.side_complete or not known(*values.values()) or None in values.values():
        return None
    values["dropout"], values["input_dropout"] = float(values["dropout"]), float(values["input_dropout"])
    return Transformer(prepend=tuple(prepend), position_dim=position_dim, **values)  # type: ignore[arg-type]


def _position_dim(checker: Checker, block: ParsedBlock, positions: Any) -> int | None:
    """The width of concatenated positions (0 unless `positions: concat`); None when misused (reported)."""
    position_dim = checker.value(block.node, "position_dim", 0)
    if not known(positions, position_dim):
        return None
    if positions == "concat" and not position_dim:
        at = checker.child(block.node, "positions")
        assert at is not None
        checker.error(at, "positions: concat needs position_dim, the width of the positions concatenated to the input")
        return None
    if positions != "concat" and position_dim:
        at = checker.child(block.node, "position_dim")
        assert at is not None
        checker.error(
            at, f"position_dim is the width of concatenated positions, but positions is {positions}", at_key=True
        )
        return None
    return position_dim


def _hstu(
    checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features, sequence: Ref | None
) -> BlockOp | None:
    keys = (
        "num_layers",
        "num_heads",
        "attention_dim",
        "linear_dim",
        "num_buckets",
        "dropout",
        "scale_input",
        "positions",
        "input_dropout",
    )
    defaults = {
        "num_layers": 1,
        "num_buckets": 128,
        "dropout": 0.0,
        "scale_input": False,
        "positions": "none",
        "input_dropout": 0.0,
    }
    values = {key: checker.value(block.node, key, defaults.get(key)) for key in keys}
    stamps = block.side.get("timestamps", [])
    if sequence is None or len(stamps) != 1:
        return None
    stamp = stamps[0]
    described = {ts.name: ts.sequence for ts in features.timestamps}
    if stamp.name not in described:
        return None  # its own definition is broken, and reported
    origin = _origin(sequence, blocks)
    if origin is None:
        message = (
            f"hstu reads '{sequence.text()}', whose positions include vectors a transformer prepended; "
            "no timestamps describe them"
        )
        checker.error(checker.child(block.node, "input") or block.node, message)
        return None
    if described[stamp.name] != origin:
        message = (
            f"timestamps '{stamp.name}' are the times of 'sparse.{described[stamp.name]}', but this hstu reads "
            f"the positions of 'sparse.{origin}'"
        )
        checker.error(stamp.node, message)
        return None
    if not known(*values.values()) or None in values.values():
        return None
    preprocessed = [
        key
        for key, off in (("scale_input", False), ("positions", "none"), ("input_dropout", 0.0))
        if values[key] != off
    ]
    if sequence.kind == "block" and preprocessed:
        message = (
            f"{preprocessed[0]} prepares the input of an hstu stack, but this hstu reads block '{sequence.text()}'; "
            "set it on the first hstu of the stack"
        )
        checker.error(checker.child(block.node, preprocessed[0]) or block.node, message)
        return None
    timestamps = Input("timestamps", stamp.name, 1, None, value_length(sequence, blocks, features))
    values["dropout"], values["input_dropout"] = float(values["dropout"]), float(values["input_dropout"])
    return Hstu(timestamps=timestamps, **values)


def _gru(
    checker: Checker, block: ParsedBlock, blocks: dict[str, ParsedBlock], features: Features, sequence: Ref | None
) -> BlockOp | None:
    keys = ("num_layers", "attention", "attention_softmax")
    defaults = {"num_layers": 1, "attention": "bilinear", "attention_softmax": True}
    values = {key: checker.value(block.node, key, defaults[key]) for key in keys}
    hidden = checker.value(block.node, "hidden_size")
    queries = block.side.get("query", [])
    if sequence is None or not block.side_complete:
        return None
    width = value_width(sequence, blocks, features)
    query = None
    if queries:
        query = _query_vector(checker, queries[0], blocks, features)
        if query is None:
            return None
        if values["num_layers"] != 1 and known(values["num_layers"]):
            at = checker.child(block.node, "num_layers") or block.node
            checker.error(at, f"a gru with a query is DIEN's AUGRU, one layer (got num_layers {values['num_layers']})")
            return None
        if values["attention"] == "dot" and query.width != width:
            message = (
                f"dot attention scores the sequence '{sequence.text()}' ({width} wide) against the query "
                f"'{query.ref()}' ({query.width} wide); they must be equally wide (or use attention: bilinear)"
            )
            checker.error(queries[0].node, message)
            return None
    aux_loss = _aux_loss(checker, block, sequence, queries, value_length(sequence, blocks, features))
    if not known(hidden, aux_loss, *values.values()):
        return None
    hidden_size = hidden if hidden is not None else width
    return Gru(hidden_size=hidden_size, query=query, aux_loss=aux_loss, **values)  # type: ignore[arg-type]


def _aux_loss(checker: Checker, block: ParsedBlock, sequence: Ref, queries: list[Ref], length: int | None) -> Any:
    """The gru's `aux_loss` (None when absent), INVALID when reported: DIEN's auxiliary loss trains
    an interest extractor (no query) on the rows of a sparse sequence feature, histories of 2 items or more."""
    node = checker.child(block.node, "aux_loss")
    if node is None:
        return None
    weight = checker.value(node, "weight")
    if not known(weight) or weight is None:  # the schema reported it
        return INVALID
    if queries:
        message = (
            "aux_loss trains DIEN's interest extractor, a gru without query; this gru is its interest "
            "evolution (an AUGRU): set aux_loss on the gru it reads"
        )
        checker.error(node, message, at_key=True)
        return INVALID
    if sequence.kind != "sparse":
        message = (
            f"aux_loss scores each state against the next item of a sparse sequence feature, "
            f"but this gru reads '{sequence.text()}'; read the feature itself (sparse.<name>)"
        )
        checker.error(node, message, at_key=True)
        return INVALID
    if length is not None and length < 2:
        kept = f"'{sequence.text()}' keeps at most {length} item (its max_length)"
        message = f"aux_loss pairs each item with the next, but {kept}"
        checker.error(node, message, at_key=True)
        return INVALID
    return AuxLoss(float(weight))


def _query_vector(checker: Checker, ref: Ref, blocks: dict[str, ParsedBlock], features: Features) -> Input | None:
    """`ref` as an Input if it is a vector of known width; reported otherwise."""
    if is_sequence(ref, blocks, features) or is_stack(ref, blocks, features):
        kind, shape = kind_name(ref, blocks, features), describe(ref, blocks, features)
        checker.error(ref.node, f"the query must be a vector, but '{ref.text()}' is {kind} {shape}")
        return None
    return input_ir(ref, blocks, features) if value_width(ref, blocks, features) is not None else None
