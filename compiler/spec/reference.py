"""Write the spec language reference (docs/spec.md) from the JSON Schema.

The schema is the single source of truth: every section, key, type, default
and example in the reference comes from `schema.json`, and the YAML rules come
from the loader's own limits. `tests/compiler/spec/test_reference.py`
regenerates the page and fails if docs/spec.md differs
(`pytest --update-goldens` rewrites it).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import yaml

from compiler.spec.load import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES

_REF_PREFIX = "#/$defs/"


def render_reference(schema: dict[str, Any]) -> str:
    """The Markdown reference of the spec language described by `schema`."""
    defs = schema["$defs"]
    sections = [
        f"# {schema['title']}",
        "<!-- Generated from compiler/spec/schema.json by compiler/spec/reference.py: do not edit.\n"
        "     Regenerate with `pytest tests/compiler/spec/test_reference.py --update-goldens`. -->",
        schema["description"],
        "`reccompile check SPEC...` reports every mistake in a spec at once; `reccompile show SPEC` prints "
        "it fully resolved (defaults filled in, `count` expanded, widths inferred); `reccompile schema` "
        "prints the JSON Schema this page is written from.",
        "## Example",
        _yaml_block(schema["examples"][0]),
        _yaml_rules(),
        "## Top level",
        _object_body(schema, defs),
    ]
    sections += [_def_section(name, defs) for name in _defs_in_order(schema, defs)]
    return "\n\n".join(sections) + "\n"


def _yaml_rules() -> str:
    return "\n".join(
        [
            "## YAML",
            "",
            "- Plain scalars follow the YAML 1.2 core schema: `1e-8` is a number, `no` and `on` are strings, "
            "`true`/`false` are booleans. Integers may use `_` between digits (`100_000`).",
            "- Duplicate keys are errors. Anchors and aliases work; merge keys (`<<`) and tags other "
            "than the core ones (`!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!map`, `!!seq`) do not.",
            f"- Limits: at most {MAX_FILE_BYTES} bytes, {MAX_NODES} nodes after alias expansion, "
            f"nesting {MAX_DEPTH} levels deep; one document per file; UTF-8.",
            "- Integers must fit in 64 bits and numbers must be finite.",
        ]
    )


def _defs_in_order(schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """The referenced definitions, depth first in the order they are first referenced."""
    seen: list[str] = []
    stack = list(reversed(list(_refs(schema))))
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.append(name)
        stack.extend(reversed([ref for ref in _refs(defs[name]) if ref not in seen]))
    return seen


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and value.startswith(_REF_PREFIX):
                yield value[len(_REF_PREFIX) :]
            elif key not in ("$defs", "examples", "default"):
                yield from _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item)


def _def_section(name: str, defs: dict[str, Any]) -> str:
    schema = defs[name]
    # the inputs and the block types are parts of the Block section
    level = "###" if name == "input" or name in _block_variants(defs) else "##"
    parts = [f"{level} {schema['title']}", schema["description"]]
    if "properties" in schema and schema.get("type") == "object":
        parts.append(_object_body(schema, defs))
    elif schema.get("type") != "object":
        parts.append("Type: " + _type_of(schema, defs) + ".")
    if name == "block":
        parts.append("Block types: " + ", ".join(_link(defs[v]) for v in _block_variants(defs)) + ".")
    for example in schema.get("examples", []):
        parts.append("Example:\n\n" + _yaml_block(example))
    return "\n\n".join(parts)


def _block_variants(defs: dict[str, Any]) -> list[str]:
    return [branch["then"]["$ref"][len(_REF_PREFIX) :] for branch in defs["block"]["allOf"]]


def _object_body(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    rows = ["| key | type | required | default | description |", "|---|---|---|---|---|"]
    for key, prop in schema["properties"].items():
        default = f"`{_flow(prop['default'])}`" if "default" in prop else ""
        cells = [f"`{key}`", _type_of(prop, defs), "yes" if key in required else "", default, prop["description"]]
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    notes = []
    if schema.get("additionalProperties") is False:
        notes.append("Any other key is an error.")
    if schema.get("minProperties"):
        notes.append("At least one key is required.")
    return "\n".join(rows) + ("\n\n" + " ".join(notes) if notes else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_of(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    """A short human description of a property's type."""
    if "$ref" in schema:
        target = defs[schema["$ref"][len(_REF_PREFIX) :]]
        return _link(target)
    if "const" in schema:
        return f"`{_flow(schema['const'])}`"
    if "enum" in schema:
        return " | ".join(f"`{value}`" for value in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_type_of(option, defs) for option in schema["anyOf"])
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return " or ".join(_kind(kind, schema, defs) for kind in kinds)


def _kind(kind: str, schema: dict[str, Any], defs: dict[str, Any]) -> str:
    if kind == "array":
        return "list of " + _type_of(schema.get("items", {}), defs)
    if kind == "object" and "additionalProperties" in schema:
        keys = _type_of(schema.get("propertyNames", {"type": ["string"]}), defs)
        return f"mapping of {keys} to {_type_of(schema['additionalProperties'], defs)}"
    if kind in ("integer", "number"):
        return kind + _bounds(schema)
    if kind == "string" and "pattern" in schema and "maxLength" not in schema:
        return "string (e.g. `16GiB`)" if "GiB" in schema["pattern"] else "string"
    return {"boolean": "`true` | `false`"}.get(kind, kind)


def _bounds(schema: dict[str, Any]) -> str:
    marks = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}
    found = [f"{mark} {schema[key]}" for key, mark in marks.items() if key in schema]
    return " " + ", ".join(found) if found else ""


def _link(schema: dict[str, Any]) -> str:
    title = schema["title"]
    anchor = re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")
    return f"[{title}](#{anchor})"


def _flow(value: Any) -> str:
    """A value in YAML flow style, as a spec would write it."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _yaml_block(value: Any) -> str:
    """A YAML code block: block style at the top level, flow style for leaf collections."""
    text = yaml.safe_dump(value, sort_keys=False, default_flow_style=None, width=100)
    if text.startswith("{"):
        text = yaml.safe_dump(value, sort_keys=False, default_flow_style=False, width=100)
    return "```yaml\n" + text + "```"
