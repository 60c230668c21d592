"""Tests of compiler/spec/load.py: positions, the YAML dialect, and the loader's limits."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from compiler.diagnostics import CompileError
from compiler.ir import Location
from compiler.spec.load import MAX_FILE_BYTES, MAX_NODES, format_path, load


def write(tmp_path: Path, text: str | bytes, name: str = "spec.yaml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def errors(path: str) -> list[str]:
    with pytest.raises(CompileError) as caught:
        load(path)
    return [f"{d.loc.line}:{d.loc.col} {d.path}: {d.message}" for d in caught.value.diagnostics]


def test_every_node_keeps_its_position_and_path(tmp_path: Path) -> None:
    doc = load(write(tmp_path, "model:\n  top: {type: mlp, layers: [512, 1]}\n"))
    assert doc.root is not None
    layers = doc.root.value["model"].value["top"].value["layers"]
    assert layers.value[1].loc == Location(doc.path, 2, 34)
    assert layers.value[1].path == ("model", "top", "layers", 1)
    assert layers.key_loc == Location(doc.path, 2, 20)
    assert doc.root.at(("model", "top", "layers", 1)) is layers.value[1]


def test_the_document_keeps_the_path_as_given_and_the_sha256_of_the_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\n")
    doc = load(path)
    assert doc.path == path
    assert doc.sha256 == hashlib.sha256(b"a: 1\n").hexdigest()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-8", 1e-8),
        ("100_000", 100000),
        ("0x10", 16),
        ("-3.5", -3.5),
        ("no", "no"),
        ("on", "on"),
        ("true", True),
        ("~", None),
        ("'12'", "12"),
        ("!!float 3", 3.0),
        ("!!str 3", "3"),
        ("2020-01-01", "2020-01-01"),
    ],
)
def test_plain_scalars_follow_the_yaml_1_2_core_schema(tmp_path: Path, text: str, value: object) -> None:
    doc = load(write(tmp_path, f"a: {text}\n"))
    assert doc.root is not None
    loaded = doc.root.plain()["a"]
    assert loaded == value and type(loaded) is type(value)


def test_an_empty_file_has_no_root(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")).root is None


def test_aliases_are_copied_with_their_new_paths(tmp_path: Path) -> None:
    doc = load(write(tmp_path, "a: &x {lr: 0.1}\nb: *x\n"))
    assert doc.root is not None
    b = doc.root.value["b"]
    assert b.plain() == {"lr": 0.1}
    assert b.value["lr"].path == ("b", "lr")
    assert b.loc.line == 2


def test_all_duplicate_keys_are_reported_at_once(tmp_path: Path) -> None:
    assert errors(write(tmp_path, "a: 1\nb: {c: 1, c: 2}\na: 3\n")) == [
        "2:11 b.c: duplicate key 'c' (first defined at 2:5)",
        "3:1 a: duplicate key 'a' (first defined at 1:1)",
    ]


def test_a_billion_laughs_fails_fast(tmp_path: Path) -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    (message,) = errors(write(tmp_path, "\n".join(lines) + "\n"))
    assert message.endswith(f"grows the spec beyond {MAX_NODES} nodes")


def test_an_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = write(tmp_path, b"#" * (MAX_FILE_BYTES + 1))
    assert errors(path) == [f"1:1 : the spec is larger than {MAX_FILE_BYTES} bytes; is this the right file?"]


def test_a_missing_file_is_a_diagnostic(tmp_path: Path) -> None:
    assert errors(str(tmp_path / "nope.yaml")) == ["1:1 : cannot read the spec: No such file or directory"]


def test_a_directory_is_a_diagnostic(tmp_path: Path) -> None:
    (message,) = errors(str(tmp_path))
    assert message.startswith("1:1 : cannot read the spec: ")


def test_invalid_utf8_is_located(tmp_path: Path) -> None:
    assert errors(write(tmp_path, b"a: 1\nb: \xc3\x28\n")) == ["2:4 : the spec is not UTF-8 text (byte 0xc3)"]


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    doc = load(write(tmp_path, "\ufeffa: 1\n".encode("utf-8")))
    assert doc.root is not None and doc.root.plain() == {"a": 1}


def test_complex_keys_are_refused(tmp_path: Path) -> None:
    message = "1:3 : mapping keys must be plain strings, not lists or mappings"
    assert errors(write(tmp_path, "? [a, b]\n: 1\n")) == [message]


def test_undefined_aliases_are_refused(tmp_path: Path) -> None:
    assert errors(write(tmp_path, "a: *nothing\n")) == ["1:4 : alias *nothing has no anchor &nothing before it"]


def test_integer_literals_too_long_to_convert_are_refused(tmp_path: Path) -> None:
    (message,) = errors(write(tmp_path, "a: " + "9" * 5000 + "\n"))
    assert message == "1:4 a: integer literal with more than 4000 digits"


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (("model", "top", "layers", 2), "model.top.layers[2]"),
        (("features", "sparse", 3, "dim"), "features.sparse[3].dim"),
        (("model", "2nd"), 'model["2nd"]'),
        ((), ""),
    ],
)
def test_format_path(path: tuple[str | int, ...], text: str) -> None:
    assert format_path(path) == text
