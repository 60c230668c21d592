"""The diagnostics collector of the semantic checks, and the spec entries those checks hand each other.

`Checker` reads only nodes the schema accepted (a rejected node reads as
`INVALID`) and collects diagnostics; `compiler.spec.semantic` and the checks
it calls (`feature_sources`, `transforms`, `values`, ...) each take it. Its own
module, below them all, so that every check imports it and none imports
`semantic` back.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from compiler.diagnostics import Diagnostic
from compiler.spec.load import Node, Path, format_path

SUGGESTION_BUDGET = 500_000  # candidate names compared for did-you-means, per spec


class _Invalid:
    """The value of a node the schema rejected."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Any = _Invalid()


class Checker:
    """Reads the node tree around schema errors and collects diagnostics."""

    def __init__(self, tainted: frozenset[Path]) -> None:
        self.tainted = tainted
        self.diagnostics: list[Diagnostic] = []
        self.suggestion_budget = SUGGESTION_BUDGET

    def error(self, node: Node, message: str, *, at_key: bool = False) -> None:
        """Report at `node` (or at its key, for messages about the key itself)."""
        loc = node.key_loc if at_key and node.key_loc is not None else node.loc
        self.diagnostics.append(Diagnostic(loc, format_path(node.path), message))

    def child(self, node: Node | None, key: str) -> Node | None:
        if node is None or not isinstance(node.value, dict):
            return None
        return node.value.get(key)

    def value(self, node: Node | None, key: str, default: Any = None) -> Any:
        """The plain value of `node[key]`: `default` if absent, `INVALID` if the schema rejected it."""
        child = self.child(node, key)
        if child is None:
            # a misspelled key is a present but unreadable value, not an absent one
            misspelled = node is not None and node.path + (key,) in self.tainted
            return INVALID if node is not None and (misspelled or not node.is_mapping) else default
        return INVALID if child.path in self.tainted else child.plain()

    def name(self, node: Node) -> str | None:
        """The `name` written in an entry, even one the schema rejected (so references to it resolve)."""
        child = self.child(node, "name")
        return child.value if child is not None and isinstance(child.value, str) else None

    def entries(self, node: Node | None, key: str) -> list[Node]:
        """The items of the list at `node[key]` (none if it is absent or not a list)."""
        child = self.child(node, key)
        return list(child.value) if child is not None and child.is_sequence else []

    def pairs(self, node: Node | None, key: str) -> list[tuple[str, Node]]:
        """The entries of the mapping at `node[key]` (none if it is absent or not a mapping)."""
        child = self.child(node, key)
        return list(child.value.items()) if child is not None and child.is_mapping else []

    def closest(self, word: str, candidates: Collection[str]) -> str | None:
        """The candidate `word` was probably meant to be, if any.

        Within a budget of candidates compared per spec, so that a spec with
        thousands of mistakes among thousands of names is still checked fast.
        """
        self.suggestion_budget -= len(candidates)
        if self.suggestion_budget < 0:
            return None
        near = [candidate for candidate in candidates if abs(len(candidate) - len(word)) <= 3]
        close = difflib.get_close_matches(word, near, n=1)
        return close[0] if close else None

    def suggest(self, word: str, candidates: Collection[str]) -> str:
        """` (did you mean 'x'?)` for the closest candidate, or nothing."""
        close = self.closest(word, candidates)
        return f" (did you mean '{close}'?)" if close else ""


def known(*values: Any) -> bool:
    return all(value is not INVALID for value in values)


def where(node: Node) -> str:
    return f"{node.loc.line}:{node.loc.col}"


@dataclass(slots=True)
class _Sparse:
    """One sparse feature after `count` expansion, before its table is resolved."""

    name: str
    entry: Node
    written: str  # the name as written (the prefix of a `count` entry)
    fields: dict[str, Any]


@dataclass(slots=True)
class _TableSpec:
    name: str
    node: Node
    rows: Any
    dim: Any
    pooling: Any
    init: Node | None
    optimizer: Node | None
    features: list[str] = field(default_factory=list)
    claimed: bool = False  # some feature means this table, rightly or not
