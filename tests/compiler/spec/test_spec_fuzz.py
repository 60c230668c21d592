"""Property tests: mutated valid specs give diagnostics or pass, never a traceback.

Each example takes a spec from specs/, mutates it (deletes, duplicates,
retypes and renames keys and values, or damages the text itself), and runs
`reccompile check` in-process: the exit status is 0 or 1, and on 1 every
line is a diagnostic and the last one counts them.
"""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.cli import main

REPO = Path(__file__).resolve().parents[3]
SPECS = sorted([*(REPO / "specs").rglob("*.yaml"), *(REPO / "tests" / "specs" / "valid").glob("*.yaml")])
DIAGNOSTIC = re.compile(r"[^\n]+:\d+:\d+: error: [^\n]+")
COUNT = re.compile(r"\d+ errors?")
REPLACEMENTS: list[Any] = [
    0,
    -1,
    1,
    2**70,
    3.5,
    float("inf"),
    "",
    "x",
    "sparse.*",
    "dense.int",
    "bottom",
    "top.ctr",
    "class",
    True,
    None,
    [],
    {},
    [1, "a"],
    {"a": 1},
    {"type": "mlp"},
]
DAMAGE = [b"\x00", b"\xff", b"\t", b": ", b"- ", b"{", b"]", b"&a ", b"*a", b"\n  ", b"'"]
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a plain YAML value (the root excluded)."""
    found: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        found.append(prefix + (key,))
        found += paths(child, prefix + (key,))
    return found


def parent(root: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        root = root[key]
    return root


def mutate(data: st.DataObject, spec: Any) -> Any:
    """Apply one to three random edits to a spec's plain data."""
    for _ in range(data.draw(st.integers(1, 3))):
        candidates = paths(spec)
        if not candidates:
            break
        path = data.draw(st.sampled_from(candidates))
        container, key = parent(spec, path), path[-1]
        action = data.draw(st.sampled_from(["delete", "duplicate", "retype", "rename", "swap"]))
        if action == "delete":
            del container[key]
        elif action == "duplicate" and isinstance(container, list):
            container.insert(key, container[key])
        elif action == "rename" and isinstance(container, dict):
            new_key = data.draw(st.sampled_from([key + "s", key[:-1], "type", "input", "name", "x y", "1"]))
            container[new_key] = container.pop(key)
        elif action == "swap":
            other = data.draw(st.sampled_from(candidates))
            if other[: len(path)] != path and path[: len(other)] != other:
                container[key] = copy.deepcopy(parent(spec, other + ("",)))
        else:
            container[key] = copy.deepcopy(data.draw(st.sampled_from(REPLACEMENTS)))
    return spec


def check(text: str | bytes, capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
        status = main(["check", str(path)])
    out, err = capsys.readouterr()
    assert status in (0, 1)
    if status == 0:
        assert out.endswith(": ok\n") and err == ""
        return
    if out.startswith(f"{path}: ok\n"):  # a good spec whose data section names data check cannot use
        assert "Traceback" not in err and "error: " in err, err
        return
    lines = err.rstrip("\n").split("\n")
    assert out == "" and COUNT.fullmatch(lines[-1]), err
    assert all(DIAGNOSTIC.fullmatch(line) for line in lines[:-1]), err
    assert len(lines) - 1 == int(lines[-1].split()[0])


@SETTINGS
@given(data=st.data(), spec=st.sampled_from(SPECS))
def test_mutated_specs_give_diagnostics_not_tracebacks(data: st.DataObject, spec: Path, capsys) -> None:
    mutated = mutate(data, yaml.safe_load(spec.read_text()))
    check(yaml.safe_dump(mutated, sort_keys=False, default_flow_style=None), capsys)


@SETTINGS
@given(data=st.data(), spec=st.sampled_from(SPECS))
def test_damaged_text_gives_diagnostics_not_tracebacks(data: st.DataObject, spec: Path, capsys) -> None:
    raw = bytearray(spec.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw)))
        edit = data.draw(st.sampled_from(["delete", "insert", "line"]))
        if edit == "delete":
            del raw[at : at + data.draw(st.integers(1, 20))]
        elif edit == "insert":
            raw[at:at] = data.draw(st.sampled_from(DAMAGE))
        else:
            lines = raw.split(b"\n")
            index = at % max(len(lines), 1)
            lines.insert(index, lines[index])
            raw = bytearray(b"\n".join(lines))
    check(bytes(raw), capsys)
