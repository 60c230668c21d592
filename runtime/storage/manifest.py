"""File manifests: the JSON file that lists a directory's files with their size and sha256.

Checkpoints (runtime.checkpoint.files) and export directories
(runtime.serving.export_dir) each end with a `manifest.json`: a format name,
a format version, and the bytes and sha256 of every file, so a reader can
tell a complete directory from a truncated, corrupted or mixed-up one before
it reads anything. This module writes and checks those facts once, for both;
it needs no torch. Problems are `ManifestProblem` / `FileProblem` values
carrying what was found; `manifest_message` and `file_message` word them
for users, one wording for every kind of directory, each `Artifact` naming
itself and its remedy (export again, build the index again, ...).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

__all__ = [
    "MANIFEST",
    "Artifact",
    "FileProblem",
    "ManifestProblem",
    "check_file",
    "describe_files",
    "file_facts",
    "file_message",
    "file_sha256",
    "manifest_message",
    "read_manifest",
    "sync_path",
    "write_manifest",
]

MANIFEST = "manifest.json"
_HASH_BLOCK = 1 << 22

FileProblemKind = Literal["missing", "truncated", "longer", "sha256"]
ManifestProblemKind = Literal["missing", "not_json", "not_object", "missing_keys", "format", "version"]


@dataclass(frozen=True)
class FileProblem(Exception):
    """A listed file that is missing or differs from its manifest entry."""

    kind: FileProblemKind
    path: Path
    expected: Mapping[str, Any]  # the manifest's {"bytes", "sha256"}
    size: int | None = None  # the file's size, when it exists
    sha256: str | None = None  # the file's sha256, when it was hashed

    def __str__(self) -> str:
        return f"{self.path}: {self.kind}"


@dataclass(frozen=True)
class ManifestProblem(Exception):
    """A manifest that is missing, not JSON, incomplete, or of another format or version."""

    kind: ManifestProblemKind
    path: Path
    detail: str = ""  # the JSON error, the missing keys, or the format or version found
    manifest: Mapping[str, Any] | None = None  # the parsed manifest, for a format or version problem

    def __str__(self) -> str:
        return f"{self.path}: {self.kind} {self.detail}".rstrip()


@dataclass(frozen=True, slots=True)
class Artifact:
    """A kind of manifest-described directory, as its messages name it."""

    name: str  # "export", "index", "checkpoint"
    article: str  # "an" or "a", for "not an export directory"
    made_by: str  # how one is written: "write one with reccompile export"
    remedy: str  # what to do about a damaged one: "export again"; "" where the caller says it
    format_version: int


def manifest_message(problem: ManifestProblem, directory: Path, artifact: Artifact) -> str:
    """One line for a manifest problem: the path, what is wrong, the remedy."""
    path, detail, remedy = problem.path, problem.detail, _then(artifact.remedy, "; ")
    if problem.kind == "missing":
        return f"{directory}: no {MANIFEST}; not {artifact.article} {artifact.name} directory ({artifact.made_by})"
    if problem.kind == "not_json":
        return f"{path}: not valid JSON ({detail}){remedy}"
    if problem.kind == "missing_keys":
        return f"{path}: lacks {detail}{remedy}"
    if problem.kind in ("not_object", "format"):
        found = detail if problem.kind == "format" else repr(detail)
        return f"{path}: not a reccompile {artifact.name} manifest (format {found})"
    return f"{path}: format version {detail}; this runtime reads version {artifact.format_version}"


def file_message(problem: FileProblem, artifact: Artifact) -> str:
    """One line for a listed file that is missing or differs from its manifest entry."""
    path, entry = problem.path, problem.expected
    if problem.kind == "missing":
        return f"{path}: missing (listed in {MANIFEST}){_then(artifact.remedy, '; ')}"
    if problem.kind in ("truncated", "longer"):
        return (
            f"{path}: {problem.size:,} bytes, {MANIFEST} says {entry['bytes']:,}; "
            f"the {artifact.name} is incomplete or corrupted{_then(artifact.remedy, ', ')}"
        )
    return (
        f"{path}: sha256 {(problem.sha256 or '')[:12]}… does not match {MANIFEST} ({entry['sha256'][:12]}…); "
        f"the file was changed or corrupted{_then(artifact.remedy, ', ')}"
    )


def _then(remedy: str, separator: str) -> str:
    return f"{separator}{remedy}" if remedy else ""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def sync_path(path: Path) -> None:
    """Force a file's bytes (or a directory's entries) to disk: a file before it is renamed into
    place, a directory after a rename in it, so a crash leaves the old state or the new one."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def file_facts(path: Path) -> dict[str, Any]:
    """{"bytes", "sha256"} of a file, as a manifest records them."""
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def check_file(path: Path, expected: Mapping[str, Any], verify: bool = True) -> None:
    """`path` exists with the manifest's size (and sha256 when `verify`); FileProblem if not."""
    if not path.is_file():
        raise FileProblem("missing", path, expected)
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise FileProblem("truncated" if size < expected["bytes"] else "longer", path, expected, size)
    if verify:
        actual = file_sha256(path)
        if actual != expected["sha256"]:
            raise FileProblem("sha256", path, expected, size, actual)


def read_manifest(path: Path, format_name: str, version: int, required: Sequence[str] = ()) -> dict[str, Any]:
    """The manifest at `path` after checking that it is a JSON object of this format and version.

    The keys in `required` must be present (checked before the format). The
    files it lists are not checked here: see `check_file`.
    """
    if not path.is_file():
        raise ManifestProblem("missing", path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ManifestProblem("not_json", path, str(error)) from None
    if not isinstance(manifest, dict):
        raise ManifestProblem("not_object", path, type(manifest).__name__)
    missing = [key for key in required if key not in manifest]
    if missing:
        raise ManifestProblem("missing_keys", path, ", ".join(missing))
    if manifest.get("format") != format_name:
        raise ManifestProblem("format", path, repr(manifest.get("format")), manifest)
    if manifest.get("format_version") != version:
        raise ManifestProblem("version", path, repr(manifest.get("format_version")), manifest)
    return manifest


def describe_files(directory: Path, names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """{name: file_facts} of `names` under `directory`, or of every file directly in it."""
    if names is None:
        names = sorted(path.name for path in directory.iterdir() if path.is_file())
    return {name: file_facts(directory / name) for name in names}


def write_manifest(path: Path, manifest: Mapping[str, Any]) -> None:
    """Write `manifest` as JSON (keys sorted) and force it to disk before returning."""
    with open(path, "w") as stream:
        json.dump(manifest, stream, indent=1, sort_keys=True)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())
