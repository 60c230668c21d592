"""Reading a plan.json that a user gives (`--plan FILE`) into a ShardingPlan.

Used by check.read_plan before the plan is checked against the spec. The
file must be well-formed: JSON, the current format_version, and for each
table its name, sharding type, compute kernel and shards of whole numbers.
Everything the planner estimates (bytes, milliseconds, ranks) is optional
and ignored, so a plan can be written by hand. Every problem becomes a
Diagnostic at the file's line and column of the offending value, with its
JSON path (`tables[3].shards[1].rows`).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import Location
from runtime.sharding.types import COMPUTE_KERNELS, SHARDING_TYPES
from compiler.planner.plan import FORMAT_VERSION, Shard, ShardingPlan, TablePlan

SHARD_FIELDS = ("rank", "row_offset", "rows", "col_offset", "cols")
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")
_SPACE = re.compile(r"[ \t\r\n]*")
_LAST_STEP = re.compile(r"(\.[^.\[]*|\[[0-9]+\])$")


@dataclass(frozen=True, slots=True)
class PlanFile:
    """A plan file's text, parsed, with where each value starts."""

    path: str
    data: Any
    line_starts: tuple[int, ...]
    offsets: dict[str, int]  # JSON path -> offset of its value

    def locate(self, path: str) -> Location:
        """Where the value at `path` is, or its nearest enclosing value that exists."""
        while path not in self.offsets and path:
            path = _LAST_STEP.sub("", path)
        return _location(self.path, self.line_starts, self.offsets.get(path, 0))


def read_plan_file(path: Path | str) -> tuple[ShardingPlan, PlanFile]:
    """The plan in `path` and the file (to place later diagnostics); CompileError if malformed."""
    name = str(path)
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise CompileError([Diagnostic(Location(name, 1, 1), "", f"cannot read the plan: {error.strerror}")])
    except UnicodeDecodeError as error:
        where = _position(Path(path).read_bytes(), error.start, name)
        raise CompileError(
            [Diagnostic(where, "", f"not a plan: byte 0x{error.object[error.start]:02x} is not UTF-8 text")]
        )
    starts = (0, *(m.end() for m in re.finditer("\n", text)))
    try:
        data = json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as error:
        where = Location(name, error.lineno, error.colno)
        raise CompileError([Diagnostic(where, "", f"invalid JSON: {error.msg}")])
    except _Constant as constant:  # Python's json reads NaN and Infinity; JSON has neither
        offset = re.search(rf"(?<![\w.]){constant.args[0]}(?!\w)", text)
        where = _location(name, starts, offset.start() if offset else 0)
        raise CompileError([Diagnostic(where, "", f"invalid JSON: {constant.args[0]} is not a JSON number")])
    except ValueError as error:  # an integer beyond Python's digit limit
        message = str(error).split(";")[0]
        raise CompileError([Diagnostic(Location(name, 1, 1), "", f"invalid JSON: {message}")])
    except RecursionError:
        raise CompileError([Diagnostic(Location(name, 1, 1), "", "invalid JSON: nested too deeply")]) from None
    plan_file = PlanFile(name, data, starts, _value_offsets(text))
    problems: list[tuple[str, str]] = []
    plan = _plan_from_data(data, problems)
    if problems or plan is None:
        raise CompileError([Diagnostic(plan_file.locate(p), p, m) for p, m in problems])
    return plan, plan_file


class _Constant(Exception):
    """NaN, Infinity or -Infinity in a plan file (args[0])."""


def _not_a_number(constant: str) -> None:
    raise _Constant(constant)


def _location(name: str, starts: tuple[int, ...], offset: int) -> Location:
    """The line and column of character `offset`, given where each line starts."""
    line = bisect.bisect_right(starts, offset)
    return Location(name, line, offset - starts[line - 1] + 1)


def _position(data: bytes, offset: int, name: str) -> Location:
    """The line and column of byte `offset` in `data`."""
    line = data.count(b"\n", 0, offset) + 1
    return Location(name, line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1)


def _plan_from_data(data: Any, problems: list[tuple[str, str]]) -> ShardingPlan | None:
    if not isinstance(data, dict):
        problems.append(("", "a plan is a JSON object"))
        return None
    if "format_version" not in data:
        problems.append(("", "missing 'format_version'"))
    elif type(data["format_version"]) is not int or data["format_version"] != FORMAT_VERSION:
        version = json.dumps(data["format_version"])
        problems.append(
            ("format_version", f"unsupported format_version {version} (this compiler reads {FORMAT_VERSION})")
        )
    world_size = _whole(data, "world_size", "", problems, minimum=1)
    device = data.get("device", "")
    if not isinstance(device, str):
        problems.append(("device", f"expected a string, got {json.dumps(device)}"))
    tables = data.get("tables")
    if not isinstance(tables, list):
        problems.append(("tables", "expected a list of tables" if "tables" in data else "missing 'tables'"))
        return None
    plans = [_table_from_data(t, f"tables[{i}]", problems) for i, t in enumerate(tables)]
    if problems or world_size is None:
        return None
    return ShardingPlan(
        world_size=world_size,
        device=device,
        inputs_sha256=str(data.get("inputs_sha256", "")),
        tables=tuple(p for p in plans if p is not None),
        ranks=(),
    )


def _table_from_data(data: Any, path: str, problems: list[tuple[str, str]]) -> TablePlan | None:
    if not isinstance(data, dict):
        problems.append((path, "expected an object with table, sharding_type, compute_kernel and shards"))
        return None
    name = _text(data, "table", path, problems, None)
    sharding_type = _text(data, "sharding_type", path, problems, SHARDING_TYPES)
    kernel = _text(data, "compute_kernel", path, problems, COMPUTE_KERNELS)
    reason = data.get("reason", "")
    shards_data = data.get("shards")
    if not isinstance(shards_data, list) or not shards_data:
        problems.append((f"{path}.shards", "expected a non-empty list of shards"))
        return None
    shards = []
    for j, shard in enumerate(shards_data):
        where = f"{path}.shards[{j}]"
        if not isinstance(shard, dict):
            problems.append((where, "expected an object with " + ", ".join(SHARD_FIELDS)))
            continue
        values = [_whole(shard, f, where, problems, minimum=1 if f == "cols" else 0) for f in SHARD_FIELDS]
        if None not in values:
            shards.append(Shard(*values))  # type: ignore[arg-type]
    if name is None or sharding_type is None or kernel is None or len(shards) != len(shards_data):
        return None
    return TablePlan(
        table=name,
        sharding_type=sharding_type,  # type: ignore[arg-type]
        compute_kernel=kernel,  # type: ignore[arg-type]
        shards=tuple(shards),
        storage_bytes=0,
        cost_ms=0.0,
        reason=reason if isinstance(reason, str) else "",
    )


def _whole(data: dict, key: str, path: str, problems: list[tuple[str, str]], minimum: int) -> int | None:
    where = f"{path}.{key}" if path else key
    if key not in data:
        problems.append((path, f"missing '{key}'"))
        return None
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append((where, f"expected a whole number, got {json.dumps(value)}"))
        return None
    if value < minimum:
        problems.append((where, f"must be at least {minimum}, got {value}"))
        return None
    return value


def _text(
    data: dict, key: str, path: str, problems: list[tuple[str, str]], choices: tuple[str, ...] | None
) -> str | None:
    if key not in data:
        problems.append((path, f"missing '{key}'"))
        return None
    value = data[key]
    if not isinstance(value, str):
        problems.append((f"{path}.{key}", f"expected a string, got {json.dumps(value)}"))
        return None
    if choices is not None and value not in choices:
        problems.append((f"{path}.{key}", f"unknown {key} '{value}' (one of: {', '.join(choices)})"))
        return None
    return value


def _value_offsets(text: str) -> dict[str, int]:
    """The offset of every value of valid JSON `text`, by JSON path ('' is the root)."""
    offsets: dict[str, int] = {}

    def skip(i: int) -> int:
        return _SPACE.match(text, i).end()  # type: ignore[union-attr]

    def value(i: int, path: str) -> int:
        i = skip(i)
        offsets[path] = i
        if text[i] == "{":
            i = skip(i + 1)
            while text[i] != "}":
                key, i = scanstring(text, i + 1)
                i = value(skip(i) + 1, f"{path}.{key}" if path else key)
                i = skip(i)
                i = skip(i + 1) if text[i] == "," else i
            return i + 1
        if text[i] == "[":
            i, index = skip(i + 1), 0
            while text[i] != "]":
                i = skip(value(i, f"{path}[{index}]"))
                i = skip(i + 1) if text[i] == "," else i
                index += 1
            return i + 1
        if text[i] == '"':
            return scanstring(text, i + 1)[1]
        match = _SCALAR.match(text, i)
        assert match is not None  # the text parsed as JSON
        return match.end()

    value(0, "")
    return offsets
