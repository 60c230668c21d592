"""Named feature groups: the top-level `groups:` section, and `groups.<name>` in a block's input.

Used by `compiler.spec.build` before the blocks are parsed. A group is a list
of `dense.<feature>` and `sparse.<feature>` references (pooled sparse
features only: a block reading a group reads vectors). `resolve_groups`
checks every member once, at the group's own line (unknown features, a
sequence, a feature listed twice); a block's `groups.<name>` then stands for
the members, in the group's order, and an unknown name is reported at the
block's input with the names that exist.
"""

from __future__ import annotations

from compiler.spec.checker import Checker, where
from compiler.spec.load import Node
from compiler.spec.semantic import Features

PREFIX = "groups"


def resolve_groups(checker: Checker, root: Node, features: Features) -> dict[str, list[tuple[str, str]] | None]:
    """{group: [(kind, feature), ...]} in the spec's order; None for a group with a bad member (reported)."""
    groups: dict[str, list[tuple[str, str]] | None] = {}
    for name, node in checker.pairs(root, PREFIX):
        if node.path in checker.tainted or not node.is_sequence:
            groups[name] = None
            continue
        members: list[tuple[str, str]] = []
        seen: dict[tuple[str, str], Node] = {}
        complete = True
        for item in node.value:
            member = _member(checker, item, features)
            if member is None:
                complete = False
            elif member in seen:
                checker.error(item, f"group '{name}' lists '{item.value}' twice (also at {where(seen[member])})")
                complete = False
            else:
                seen[member] = item
                members.append(member)
        groups[name] = members if complete else None
    return groups


def _member(checker: Checker, item: Node, features: Features) -> tuple[str, str] | None:
    if item.path in checker.tainted or not isinstance(item.value, str):
        return None
    kind, _, name = item.value.partition(".")
    if kind not in ("dense", "sparse") or not name or "." in name:
        kinds = [
            kind
            for kind, names in (("dense", features.dense_sizes), ("sparse", features.sparse_dims))
            if item.value in names
        ]
        hint = f" (did you mean '{kinds[0]}.{item.value}'?)" if kinds else ""
        expected = "a group lists dense.<feature> or sparse.<feature>"
        checker.error(item, f"'{item.value}' is not a feature reference{hint}: {expected}")
        return None
    if name == "*":
        checker.error(item, "a group lists features one by one; 'sparse.*' names every pooled feature")
        return None
    names = features.dense_sizes if kind == "dense" else features.sparse_dims
    if name not in names:
        checker.error(item, f"unknown {kind} feature '{name}'{checker.suggest(name, names)}")
        return None
    if kind == "sparse" and name in features.sequence_lengths:
        checker.error(item, f"'{item.value}' is a sequence (pooling: none); a group lists vectors")
        return None
    return kind, name


def group_members(
    checker: Checker, item: Node, groups: dict[str, list[tuple[str, str]] | None]
) -> list[tuple[str, str]] | None:
    """The members `groups.<name>` (the text of `item`) stands for; None if unknown (reported) or broken."""
    name = item.value[len(PREFIX) + 1 :]
    if name not in groups:
        known = ", ".join(groups) if groups else "none (the spec has no groups: section)"
        checker.error(item, f"unknown group '{name}'{checker.suggest(name, groups)}; groups: {known}")
        return None
    return groups[name]
