"""The deterministic text form of a `ModelIR`: the fully resolved spec, defaults included.

Printed by `reccompile show` and compared in golden tests. It reads like the
spec it came from (YAML: it parses back as YAML), but every default is
filled in, `count:` is expanded, `sparse.*` is spelled out, every input
carries its width and every block its output width. Spec positions follow
each entry as `# line:col` comments.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from compiler.ir import Block, Data, DenseFeature, Head, Input, Location, ModelIR, Sharding, SparseFeature, Training

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./*-]*")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def format_ir(ir: ModelIR) -> str:
    """The IR as readable, stable YAML text (one trailing newline)."""
    lines = [
        f"# {ir.name}: the resolved spec, defaults included",
        f"version: {ir.version}",
        f"name: {_scalar(ir.name)}",
        f"source: {_scalar(ir.source)}",
        f"source_sha256: {ir.source_sha256}",
        "features:",
        "  dense:" + ("" if ir.dense else " []"),
        *(_dense_entry(feature) for feature in ir.dense),
        "  sparse:" + ("" if ir.sparse else " []"),
        *(_sparse_entry(feature) for feature in ir.sparse),
        *(["  timestamps:"] if ir.timestamps else []),
        *(_entry(4, feature, feature.loc) for feature in ir.timestamps),
        "tables:" + ("" if ir.tables else " []"),
        *(_entry(2, table, table.loc) for table in ir.tables),
        "model:",
        *(line for block in ir.blocks for line in _block(block)),
        "heads:",
        *(line for head in ir.heads for line in _head(head)),
        *_training(ir.training),
        *_sharding(ir.sharding),
        *_data(ir.data),
    ]
    return "\n".join(lines) + "\n"


def _block(block: Block) -> list[str]:
    fields = _fields(block.op)
    lines = [f"  {block.name}:{_comment(block.loc)}", f"    type: {block.type}"]
    lines.append("    input:")
    lines += [f"      {ref.ref()}: {_value_shape(ref)}" for ref in block.inputs]
    lines += [f"    {key}: {_flow(value)}" for key, value in fields.items()]
    lines.append(f"    width: {block.width}")
    if block.length is not None:
        lines.append(f"    length: {block.length}")  # a sequence output: [B, <= length, width]
    if block.fields is not None:
        lines.append(f"    fields: {block.fields}")  # a field stack output: [B, fields, width]
    return lines


def _value_shape(ref: Input) -> str:
    """A vector's width, a sequence's {length, width}, or a field stack's {fields, width}."""
    if ref.fields is not None:
        return f"{{fields: {ref.fields}, width: {ref.width}}}"
    return str(ref.width) if ref.length is None else f"{{length: {ref.length}, width: {ref.width}}}"


def _head(head: Head) -> list[str]:
    lines = [f"  - name: {_scalar(head.name)}{_comment(head.loc)}"]
    lines.append(f"    input: {{{head.input.ref()}: {head.input.width}}}")
    skip = ("name", "input") if head.retrieval is not None else ("name", "input", "retrieval")
    lines += [f"    {key}: {_flow(value)}" for key, value in _fields(head, skip=skip).items()]
    return lines


def _training(training: Training) -> list[str]:
    return ["training:" + _comment(training.loc)] + _body(training)


def _sharding(sharding: Sharding) -> list[str]:
    lines = ["sharding:" + _comment(sharding.loc)] + _body(sharding, skip=("constraints",))
    lines.append("  constraints:" + ("" if sharding.constraints else " []"))
    lines += [_entry(4, constraint, constraint.loc) for constraint in sharding.constraints]
    return lines


def _data(data: Data | None) -> list[str]:
    if data is None:
        return ["data: null"]
    lines = ["data:" + _comment(data.loc)] + _body(data, skip=("columns",))
    lines.append("  columns: {" + ", ".join(f"{_scalar(k)}: {_scalar(v)}" for k, v in data.columns) + "}")
    return lines


def _body(value: Any, skip: tuple[str, ...] = ()) -> list[str]:
    return [f"  {key}: {_flow(item)}" for key, item in _fields(value, skip).items()]


def _entry(indent: int, value: Any, loc: Location) -> str:
    return " " * indent + "- " + _flow(value) + _comment(loc)


def _dense_entry(feature: DenseFeature) -> str:
    """A dense feature; `embed_dim` and `embed_bias` only on one with `embed` (a field stack)."""
    skip: tuple[str, ...] = () if feature.is_stack else ("embed_dim", "embed_bias")
    skip += () if feature.transform is not None else ("transform",)
    fields = ", ".join(f"{key}: {_flow(item)}" for key, item in _fields(feature, skip).items())
    return "    - {" + fields + "}" + _comment(feature.loc)


def _sparse_entry(feature: SparseFeature) -> str:
    """A sparse feature; `max_length` and `keep` only on a sequence (a pooled feature has neither),
    `column` and its index and boundaries only where it reads another column, `position_weighted` when set."""
    skip: tuple[str, ...] = () if feature.is_sequence else ("max_length", "keep")
    if feature.column is None:
        skip += ("column", "column_index", "boundaries")
    elif not feature.boundaries:
        skip += ("column_index", "boundaries")
    if not feature.position_weighted:
        skip += ("position_weighted",)
    if feature.transform is None:
        skip += ("transform",)
    fields = ", ".join(f"{key}: {_flow(item)}" for key, item in _fields(feature, skip).items())
    return "    - {" + fields + "}" + _comment(feature.loc)


def _comment(loc: Location) -> str:
    return f"  # {loc.line}:{loc.col}"


def _fields(value: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A dataclass's fields in declaration order, without locations (`loc`, `<field>_loc`)."""
    return {
        field.name: getattr(value, field.name)
        for field in dataclasses.fields(value)
        if field.name != "loc" and not field.name.endswith("_loc") and field.name not in skip
    }


def _flow(value: Any) -> str:
    """One value in YAML flow style."""
    if isinstance(value, Input):
        return _scalar(value.ref())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = getattr(value, "kind", None)  # a feature transform (runtime.config.transforms): say which
        named = {"kind": kind} if isinstance(kind, str) and "kind" not in _fields(value) else {}
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in {**named, **_fields(value)}.items()) + "}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_flow(item) for item in value) + "]"
    return _scalar(value)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)
