"""The one diagnostic type of the compiler, rendered like a compiler does.

Every pass reports problems as `Diagnostic`s; a pass that cannot go on raises
`CompileError` holding all of them. The CLI prints them sorted by position,
one `FILE:LINE:COL: error: PATH: MESSAGE` line each, then `N errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from compiler.ir import Location


@dataclass(frozen=True, slots=True)
class Diagnostic:
    loc: Location
    path: str  # the spec path of the offending node, e.g. `model.top.layers[2]`
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        path = f"{self.path}: " if self.path else ""
        return f"{self.loc}: {self.severity}: {path}{self.message}"


class CompileError(Exception):
    """Raised by a pass with every diagnostic it found."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = tuple(sort_diagnostics(diagnostics))
        super().__init__(render(self.diagnostics))


def sort_diagnostics(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Sorted by file, line, column, then text; exact duplicates dropped."""
    unique = set(diagnostics)
    return sorted(unique, key=lambda d: (d.loc.file, d.loc.line, d.loc.col, d.path, d.message))


def render(diagnostics: Iterable[Diagnostic]) -> str:
    """The diagnostics one per line, then the error count (`1 error`, `3 errors`)."""
    ordered = sort_diagnostics(diagnostics)
    errors = sum(1 for d in ordered if d.severity == "error")
    lines = [str(d) for d in ordered]
    if errors:
        lines.append(f"{errors} error" + ("" if errors == 1 else "s"))
    return "\n".join(lines)
