"""runtime.storage.manifest: the facts written once, and every problem a reader can meet."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from runtime.storage.manifest import (
    FileProblem,
    ManifestProblem,
    check_file,
    describe_files,
    file_facts,
    read_manifest,
    write_manifest,
)


def test_file_facts_are_the_size_and_sha256(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 10_000_000)  # more than one hashing block
    assert file_facts(path) == {"bytes": 10_000_000, "sha256": hashlib.sha256(b"x" * 10_000_000).hexdigest()}


def test_a_written_manifest_reads_back_with_its_files_described(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    (tmp_path / "b").write_bytes(b"")
    (tmp_path / "sub").mkdir()
    manifest = {"format": "f", "format_version": 3, "files": describe_files(tmp_path)}
    write_manifest(tmp_path / "manifest.json", manifest)
    assert read_manifest(tmp_path / "manifest.json", "f", 3, ("files",)) == manifest
    assert manifest["files"] == {
        "a": {"bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()},
        "b": {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()},
    }
    assert describe_files(tmp_path, ["b"]) == {"b": manifest["files"]["b"]}


@pytest.mark.parametrize(
    ("text", "kind", "detail"),
    [
        (None, "missing", ""),
        ('{"format": ', "not_json", "Expecting value: line 1 column 12 (char 11)"),
        ("[1]", "not_object", "list"),
        ('{"format": "f"}', "missing_keys", "files, step"),
        ('{"format": "g", "format_version": 3, "files": {}, "step": 1}', "format", "'g'"),
        ('{"format": "f", "format_version": 2, "files": {}, "step": 1}', "version", "2"),
    ],
)
def test_each_manifest_problem_says_what_was_found(tmp_path: Path, text: str | None, kind: str, detail: str) -> None:
    path = tmp_path / "manifest.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ManifestProblem) as raised:
        read_manifest(path, "f", 3, ("files", "step"))
    assert (raised.value.kind, raised.value.path, raised.value.detail) == (kind, path, detail)


def test_each_file_problem_carries_the_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    path.write_bytes(b"0123456789")
    expected = file_facts(path)
    check_file(path, expected)

    def problem(verify: bool = True) -> FileProblem:
        with pytest.raises(FileProblem) as raised:
            check_file(path, expected, verify)
        return raised.value

    path.write_bytes(b"01234")
    assert (problem().kind, problem().size) == ("truncated", 5)
    path.write_bytes(b"0123456789ab")
    assert (problem().kind, problem().size) == ("longer", 12)
    path.write_bytes(b"0123456780")
    changed = problem()
    assert (changed.kind, changed.sha256) == ("sha256", hashlib.sha256(b"0123456780").hexdigest())
    check_file(path, expected, verify=False)  # the size alone is right
    path.unlink()
    assert problem().kind == "missing"
