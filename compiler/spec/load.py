"""Load a spec file into a `Document`: plain YAML data where every node keeps its position.

First stage of the front end (load -> validate). The YAML is read event by
event with PyYAML's safe parser and the tree is built here, iteratively, so
that the loader controls everything a hostile file could abuse: the file size,
the nesting depth, alias expansion (a billion-laughs file fails at the alias
that crosses the node budget), duplicate keys and tags. Plain scalars are
resolved with the YAML 1.2 core schema (`1e-8` is a float, `no` is a string),
plus `_` digit separators in integers (`100_000`).

`load` raises `CompileError` for anything that stops the tree from being
built; everything else is left to `compiler.spec.validate`.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Union

import yaml

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import Location

MAX_FILE_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 32
MAX_INT_DIGITS = 4000  # below Python's int-from-str limit

PathKey = Union[str, int]
Path = tuple[PathKey, ...]

_CORE = "tag:yaml.org,2002:"
_NULL = re.compile(r"~|null|Null|NULL|")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"[-+]?[0-9]+(?:_[0-9]+)*")
_INT_BASED = re.compile(r"0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(?:inf|Inf|INF)")
_NAN = re.compile(r"\.(?:nan|NaN|NAN)")


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """One YAML node: a scalar, a list of nodes or a dict of nodes, with its position.

    `path` is the node's place in the document (`("model", "top", "layers", 2)`);
    `key_loc` is the position of the key when the node is a mapping value.
    """

    value: Any
    loc: Location
    path: Path
    key_loc: Location | None = None

    @property
    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_sequence(self) -> bool:
        return isinstance(self.value, list)

    def plain(self) -> Any:
        """The node as plain Python data (dicts, lists, scalars), positions dropped."""
        if isinstance(self.value, dict):
            return {key: child.plain() for key, child in self.value.items()}
        if isinstance(self.value, list):
            return [child.plain() for child in self.value]
        return self.value

    def at(self, path: Path) -> Node:
        """The descendant at a relative path; the deepest existing node if it runs out."""
        node = self
        for key in path:
            child = _child(node, key)
            if child is None:
                break
            node = child
        return node


@dataclass(frozen=True, slots=True)
class Document:
    """A loaded spec: the file path as given, the sha256 of its bytes and the node tree.

    `root` is None for an empty file (no YAML document at all).
    """

    path: str
    sha256: str
    root: Node | None

    def start(self) -> Location:
        return Location(self.path, 1, 1)


def load(path: str) -> Document:
    """Read and parse the spec at `path`; raise `CompileError` if no tree can be built."""
    data = _read_bytes(path)
    text = _decode(path, data)
    root = _Builder(path).build(text)
    return Document(path=path, sha256=hashlib.sha256(data).hexdigest(), root=root)


def format_path(path: Path) -> str:
    """`("model", "top", "layers", 2)` -> `model.top.layers[2]`; odd keys are quoted."""
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            out += f".{key}" if out else key
        else:
            out += "[" + _quote(key) + "]"
    return out


def _quote(text: str) -> str:
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


def _child(node: Node, key: PathKey) -> Node | None:
    if isinstance(node.value, dict) and isinstance(key, str):
        return node.value.get(key)
    if isinstance(node.value, list) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key]
    return None


def _fail(file: str, line: int, col: int, message: str) -> CompileError:
    return CompileError([Diagnostic(Location(file, line, col), "", message)])


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise _fail(path, 1, 1, f"cannot read the spec: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _fail(path, 1, 1, f"the spec is larger than {MAX_FILE_BYTES} bytes; is this the right file?")
    return data


def _decode(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        before = data[: error.start]
        line = before.count(b"\n") + 1
        col = len(before[before.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
        byte = data[error.start]
        raise _fail(path, line, col, f"the spec is not UTF-8 text (byte 0x{byte:02x})") from None


def _line_col(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


@dataclass(slots=True)
class _Open:
    """A mapping or sequence under construction."""

    node: Node
    anchor: str | None
    pending_key: tuple[str, Location] | None = None
    key_lines: dict[str, Location] = field(default_factory=dict)


class _Builder:
    """Builds the `Node` tree from PyYAML parser events, with all the limits."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.stack: list[_Open] = []
        self.anchors: dict[str, Node] = {}
        self.sizes: dict[int, int] = {}
        self.open_anchors: set[str] = set()
        self.count = 0
        self.errors: list[Diagnostic] = []
        self.root: Node | None = None
        self.documents = 0

    def build(self, text: str) -> Node | None:
        try:
            parser = yaml.SafeLoader(text)
            while parser.check_event():
                self._on_event(parser.get_event())
        except yaml.MarkedYAMLError as error:
            raise self._syntax_error(error) from None
        except yaml.reader.ReaderError as error:
            line, col = _line_col(text, error.position)
            message = f"invalid YAML: character U+{error.character:04X} is not allowed"
            raise _fail(self.file, line, col, message) from None
        if self.errors:
            raise CompileError(self.errors)
        return self.root

    def _syntax_error(self, error: yaml.MarkedYAMLError) -> CompileError:
        """PyYAML's message at its problem position, with the context it was parsing."""
        mark = error.problem_mark or error.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        message = f"invalid YAML: {error.problem or error.context}"
        context = error.context_mark
        if error.problem and error.context and context is not None:
            message += f" ({error.context} at {context.line + 1}:{context.column + 1})"
        return _fail(self.file, line, col, message)

    def _loc(self, event: yaml.Event) -> Location:
        return Location(self.file, event.start_mark.line + 1, event.start_mark.column + 1)

    def _on_event(self, event: yaml.Event) -> None:
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                loc = self._loc(event)
                raise _fail(self.file, loc.line, loc.col, "the spec must be a single YAML document")
        elif isinstance(event, yaml.ScalarEvent):
            self._on_scalar(event)
        elif isinstance(event, yaml.AliasEvent):
            self._on_alias(event)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            self._on_start(event)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            opened = self.stack.pop()
            if opened.anchor is not None:
                self.open_anchors.discard(opened.anchor)
            self._finish(opened.node, opened.anchor, self._size(opened.node))

    def _grow(self, nodes: int, loc: Location, what: str) -> None:
        """Count `nodes` more nodes in the tree; fail once the budget is spent."""
        self.count += nodes
        if self.count > MAX_NODES:
            raise _fail(self.file, loc.line, loc.col, f"{what} grows the spec beyond {MAX_NODES} nodes")

    def _place(self) -> tuple[Path, Location | None]:
        """The path of the node about to be added, and its key's position."""
        if not self.stack:
            return (), None
        top = self.stack[-1]
        if isinstance(top.node.value, list):
            return top.node.path + (len(top.node.value),), None
        assert top.pending_key is not None
        key, key_loc = top.pending_key
        return top.node.path + (key,), key_loc

    def _expects_key(self) -> bool:
        return bool(self.stack) and self.stack[-1].node.is_mapping and self.stack[-1].pending_key is None

    def _on_scalar(self, event: yaml.ScalarEvent) -> None:
        loc = self._loc(event)
        if self._expects_key():
            if event.value == "<<" and event.style is None:
                raise _fail(self.file, loc.line, loc.col, "merge keys (<<) are not supported; write the keys out")
            self._on_key(event.value, loc)
            return
        self._grow(1, loc, "this value")
        path, key_loc = self._place()
        value = self._scalar_value(event, Node(None, loc, path))
        self._finish(Node(value, loc, path, key_loc), event.anchor, 1)

    def _on_key(self, key: str, loc: Location) -> None:
        top = self.stack[-1]
        first = top.key_lines.get(key)
        if first is not None:
            message = f"duplicate key '{key}' (first defined at {first.line}:{first.col})"
            self._error(Node(None, loc, top.node.path + (key,)), message)
        else:
            top.key_lines[key] = loc
        top.pending_key = (key, loc)

    def _on_start(self, event: yaml.CollectionStartEvent) -> None:
        loc = self._loc(event)
        if self._expects_key():
            raise _fail(self.file, loc.line, loc.col, "mapping keys must be plain strings, not lists or mappings")
        mapping = isinstance(event, yaml.MappingStartEvent)
        expected = _CORE + ("map" if mapping else "seq")
        if len(self.stack) >= MAX_DEPTH:
            raise _fail(self.file, loc.line, loc.col, f"the spec nests deeper than {MAX_DEPTH} levels")
        self._grow(1, loc, "this value")
        path, key_loc = self._place()
        if event.tag not in (None, "!", expected):
            self._error(Node(None, loc, path), f"unsupported YAML tag '{event.tag}'")
        self.stack.append(_Open(Node({} if mapping else [], loc, path, key_loc), event.anchor))
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)

    def _on_alias(self, event: yaml.AliasEvent) -> None:
        loc = self._loc(event)
        if self._expects_key():
            raise _fail(self.file, loc.line, loc.col, "mapping keys must be plain strings, not aliases")
        if event.anchor in self.open_anchors:
            raise _fail(self.file, loc.line, loc.col, f"alias *{event.anchor} refers to a node that contains it")
        target = self.anchors.get(event.anchor)
        if target is None:
            message = f"alias *{event.anchor} has no anchor &{event.anchor} before it"
            raise _fail(self.file, loc.line, loc.col, message)
        size = self.sizes[id(target)]
        self._grow(size, loc, f"expanding alias *{event.anchor}")
        path, key_loc = self._place()
        copy = _copy(target, path)
        self._finish(Node(copy.value, loc, path, key_loc), None, size)

    def _finish(self, node: Node, anchor: str | None, size: int) -> None:
        """Attach a completed node to its parent (or make it the root)."""
        self.sizes[id(node)] = size
        if anchor is not None:
            self.anchors[anchor] = node
        if not self.stack:
            self.root = node
            return
        top = self.stack[-1]
        if isinstance(top.node.value, list):
            top.node.value.append(node)
            return
        assert top.pending_key is not None
        key = top.pending_key[0]
        top.node.value.setdefault(key, node)
        top.pending_key = None

    def _size(self, node: Node) -> int:
        children = node.value.values() if isinstance(node.value, dict) else node.value
        return 1 + sum(self.sizes.get(id(child), 1) for child in children)

    def _error(self, at: Node, message: str) -> None:
        self.errors.append(Diagnostic(at.loc, format_path(at.path), message))

    def _scalar_value(self, event: yaml.ScalarEvent, at: Node) -> Any:
        tag, text = event.tag, event.value
        kind = tag[len(_CORE) :] if tag is not None and tag.startswith(_CORE) else None
        if tag not in (None, "!") and kind not in ("str", "int", "float", "bool", "null"):
            self._error(at, f"unsupported YAML tag '{tag}'")
            return text
        if kind == "str" or tag == "!" or (tag is None and event.style is not None):
            return text
        if len(text) > MAX_INT_DIGITS and _INT.fullmatch(text):
            self._error(at, f"integer literal with more than {MAX_INT_DIGITS} digits")
            return text
        value = _resolve_plain(text)
        if kind is None or _core_kind(value) == kind:
            return value
        if kind == "float" and _core_kind(value) == "int":
            return float(value)
        self._error(at, f"'{text}' is not a valid !!{kind}")
        return text


def _core_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float"}.get(type(value), "str")


def _resolve_plain(text: str) -> Any:
    """A plain scalar under the YAML 1.2 core schema (plus `_` in integers)."""
    if _NULL.fullmatch(text):
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _INT.fullmatch(text):
        return int(text)
    if _INT_BASED.fullmatch(text):
        return int(text, 0)
    if _FLOAT.fullmatch(text):
        return float(text)
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    if _NAN.fullmatch(text):
        return math.nan
    return text


def _copy(node: Node, path: Path) -> Node:
    """A copy of an anchored subtree placed at `path` (positions stay where it was written)."""
    value = node.value
    if isinstance(value, dict):
        value = {key: _copy(child, path + (key,)) for key, child in value.items()}
    elif isinstance(value, list):
        value = [_copy(child, path + (index,)) for index, child in enumerate(value)]
    return Node(value, node.loc, path, node.key_loc)
