"""The files of a checkpoint directory: naming, the manifest, atomic commit, pruning, checks.

`runtime.checkpoint.store` writes the tensors with torch.distributed.checkpoint;
this module owns everything around them and needs no process group:

    DIR/step_00000040/            a complete checkpoint (the name carries the step)
        manifest.json             step, world size, plan, spec sha256, and every file's size and sha256
        .metadata                 DCP's index: each key's global shape and the chunks that hold it
        __0_0.distcp ...          DCP's data, one file per rank
    DIR/.step_00000060.partial/   a save in progress, or one killed halfway: never read
    DIR/.step_00000020.deleting/  a checkpoint being pruned: never read

A save writes into the `.partial` directory, then the manifest (listing the
files it checked), then renames the directory to `step_<N>` (atomic on a
POSIX file system). So a `step_<N>` directory is complete by construction and
a save killed at any point leaves the previous checkpoints as they were.
Pruning renames a checkpoint to `.deleting` before removing it, for the same
reason. The latest checkpoint is the `step_<N>` with the highest N; its files
are checked against the manifest before anything is read, and every problem
is a `CheckpointError` naming the file.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from runtime.storage.manifest import (
    MANIFEST,
    Artifact,
    FileProblem,
    ManifestProblem,
    check_file,
    describe_files,
    file_message,
    manifest_message,
    read_manifest,
    sync_path,
    write_manifest,
)

FORMAT = "reccompile-checkpoint"
FORMAT_VERSION = 1
# No remedy in the messages: resume passes over a damaged checkpoint and says so itself.
CHECKPOINT = Artifact("checkpoint", "a", "a save cut short leaves none", "", FORMAT_VERSION)
REQUIRED_KEYS = ("format", "format_version", "step", "world_size", "spec_sha256", "plan", "files")

_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(Exception):
    """A checkpoint that cannot be written, found, or read; the message names the file."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def partial_dir(root: Path, step: int) -> Path:
    return root / f".{step_dir_name(step)}.partial"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every `step_<N>` directory under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None if there is none."""
    found = complete_checkpoints(Path(root))
    return found[-1][1] if found else None


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is one checkpoint (its manifest, or a `step_<N>` name), not a folder of them."""
    return (path / MANIFEST).exists() or bool(_STEP_DIR.match(path.name))


def resolve(directory: str | Path) -> Path:
    """`directory` itself if it is one checkpoint, else the latest complete one under it."""
    path = Path(directory)
    if is_checkpoint(path):
        return path
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(f"no complete checkpoint in {path} (no step_<N> directory)")
    return latest


def read_manifest_file(checkpoint: Path) -> dict[str, Any]:
    """The manifest of one checkpoint directory, checked for form (not its files)."""
    path = checkpoint / MANIFEST
    try:
        manifest = read_manifest(path, FORMAT, FORMAT_VERSION, REQUIRED_KEYS)
    except ManifestProblem as problem:
        raise CheckpointError(manifest_message(problem, checkpoint, CHECKPOINT)) from None
    named = _STEP_DIR.match(checkpoint.name)
    if named and int(named.group(1)) != manifest["step"]:
        raise CheckpointError(
            f"{path}: says step {manifest['step']!r} but the directory is named for step "
            f"{int(named.group(1))}: the checkpoint was moved or edited"
        )
    return manifest


def verify_files(checkpoint: Path, manifest: Mapping[str, Any]) -> None:
    """Every file the manifest lists exists with its size and sha256; CheckpointError if not."""
    for name, expected in manifest["files"].items():
        try:
            check_file(checkpoint / name, expected)
        except FileProblem as problem:
            raise CheckpointError(file_message(problem, CHECKPOINT)) from None


def prepare_partial(root: Path, step: int) -> Path:
    """An empty `.partial` directory for `step`, after removing what killed saves left behind."""
    root.mkdir(parents=True, exist_ok=True)
    for child in root.iterdir():
        if child.name.startswith(".step_") and child.name.endswith((".partial", ".deleting")):
            shutil.rmtree(child, ignore_errors=True)
    partial = partial_dir(root, step)
    partial.mkdir()
    return partial


def commit(partial: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest (with the files' sizes and hashes) and rename `partial` into place."""
    manifest = {**manifest, "files": describe_files(partial)}
    write_manifest(partial / MANIFEST, manifest)
    final = partial.parent / step_dir_name(int(manifest["step"]))
    if final.exists():  # a rerun from an older checkpoint reached this step again
        _remove(final)
    os.rename(partial, final)
    sync_path(final.parent)
    return final


def prune(root: Path, keep: int, upto: int, damaged: Collection[Path] = ()) -> None:
    """Remove all but the newest `keep` checkpoints at or before step `upto`, the one just saved.

    Later ones are not the saving run's: a run resumes from the newest checkpoint it can read, so
    they are ones it passed over as damaged, as are `damaged` (the resume's list, whatever their
    step). Those neither count towards `keep` (which would remove intact checkpoints while they
    stay) nor go: `commit` replaces each when the run saves at its step, and one it never saves
    at is left for the user to look into.
    """
    spared = {Path(path).name for path in damaged}
    ours = [path for step, path in complete_checkpoints(root) if step <= upto and path.name not in spared]
    for path in ours[:-keep]:
        _remove(path)


def _remove(path: Path) -> None:
    # Renamed first, so a kill halfway through never leaves a damaged step_<N> behind.
    doomed = path.parent / f".{path.name}.deleting"
    os.rename(path, doomed)
    sync_path(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)
