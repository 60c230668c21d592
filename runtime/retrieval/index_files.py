"""An index on disk: a directory with the index, the item ids and a manifest.

    manifest.json    format reccompile-index v1: kind, dim, count, search
                     parameters, and the bytes and sha256 of every file
    ids.pt           the item id of each row (torch.save of a long tensor)
    embeddings.pt    the item embeddings [N, D] (kind exact)
    index.faiss      faiss.write_index's file (kinds flat, ivf, hnsw)

`load_index` checks every file against the manifest (size always, sha256
unless `verify=False`) before reading it; each failure is an `IndexFileError`
naming the file and what to do. Tensors load with weights_only, so an index
directory runs no pickled code.

    >>> _ = save_index(build_index(torch.eye(3)), "items.index")
    >>> load_index("items.index").search(torch.tensor([[0.0, 2.0, 1.0]]), k=1)
    (tensor([[2.]]), tensor([[1]]))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from runtime.retrieval.index import (
    ExactIndex,
    FaissIndex,
    ItemIndex,
    apply_search_params,
    faiss_available,
    require_faiss,
)
from runtime.storage.manifest import (
    MANIFEST,
    Artifact,
    FileProblem,
    ManifestProblem,
    check_file,
    file_facts,
    file_message,
    manifest_message,
    read_manifest,
    write_manifest,
)
from runtime.storage.output import save_tensors

__all__ = ["FORMAT", "FORMAT_VERSION", "IndexFileError", "load_index", "save_index"]

FORMAT = "reccompile-index"
FORMAT_VERSION = 1
INDEX = Artifact(
    "index", "an", "build one with save_index or reccompile export", "build the index again", FORMAT_VERSION
)
IDS_FILE = "ids.pt"
EMBEDDINGS_FILE = "embeddings.pt"
FAISS_FILE = "index.faiss"


class IndexFileError(Exception):
    """An index directory is missing, incomplete, corrupted, or needs faiss that is not installed."""


def save_index(index: ItemIndex, directory: str | Path) -> Path:
    """Write `index` to `directory` (created; files of the same names replaced), manifest last."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    save_tensors(index.ids.clone(), root / IDS_FILE)
    if isinstance(index, ExactIndex):
        save_tensors(index.embeddings.clone(), root / EMBEDDINGS_FILE)
        data_file, dim = EMBEDDINGS_FILE, index.embeddings.shape[1]
    else:
        # write_index's bytes, written by Python: a full disk is an OSError, not faiss's RuntimeError
        (root / FAISS_FILE).write_bytes(require_faiss(index.kind).serialize_index(index.index).tobytes())
        data_file, dim = FAISS_FILE, index.index.d
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": index.kind,
        "dim": int(dim),
        "count": int(index.ids.numel()),
        "params": dict(index.params),
        "files": {name: {"file": name, **file_facts(root / name)} for name in (IDS_FILE, data_file)},
    }
    write_manifest(root / MANIFEST, manifest)
    return root


def load_index(directory: str | Path, verify: bool = True) -> ItemIndex:
    """The index saved in `directory`, every file checked against its manifest first."""
    root = Path(directory)
    if not root.is_dir():
        raise IndexFileError(f"index directory {root} does not exist")
    try:
        manifest = read_manifest(root / MANIFEST, FORMAT, FORMAT_VERSION, ("kind", "dim", "count", "files"))
    except ManifestProblem as problem:
        raise IndexFileError(manifest_message(problem, root, INDEX)) from None
    kind = manifest["kind"]
    ids = _load_tensor(root, manifest, IDS_FILE, verify)
    if ids.numel() != manifest["count"]:
        raise IndexFileError(f"{root / IDS_FILE}: {ids.numel()} ids, {MANIFEST} says {manifest['count']}")
    if kind == "exact":
        return ExactIndex(_load_tensor(root, manifest, EMBEDDINGS_FILE, verify), ids)
    path = _checked(root, manifest, FAISS_FILE, verify)
    if not faiss_available():
        raise IndexFileError(
            f"{path}: a faiss {kind!r} index, and faiss is not installed "
            "(pip install 'reccompile[faiss]', or export again with index kind 'exact')"
        )
    faiss = require_faiss(kind)
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "unreadable"
        raise IndexFileError(f"{path}: faiss cannot read it ({first}); build the index again") from None
    if index.ntotal != manifest["count"] or index.d != manifest["dim"]:
        raise IndexFileError(
            f"{path}: {index.ntotal} vectors of dim {index.d}, {MANIFEST} says "
            f"{manifest['count']} of dim {manifest['dim']}; the files come from different indexes"
        )
    params = manifest.get("params", {})
    apply_search_params(index, kind, params)
    return FaissIndex(index, ids, kind, params)


def _checked(root: Path, manifest: Mapping[str, Any], name: str, verify: bool) -> Path:
    entry = manifest["files"].get(name)
    if entry is None:
        raise IndexFileError(
            f"{root / MANIFEST}: lists no {name} for a {manifest['kind']!r} index; build the index again"
        )
    try:
        check_file(root / entry["file"], entry, verify)
    except FileProblem as problem:
        raise IndexFileError(file_message(problem, INDEX)) from None
    return root / entry["file"]


def _load_tensor(root: Path, manifest: Mapping[str, Any], name: str, verify: bool) -> torch.Tensor:
    path = _checked(root, manifest, name, verify)
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a corrupt zip, a pickle with code in it, ...
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise IndexFileError(f"{path}: cannot be read ({first}); build the index again") from None
    if not isinstance(value, torch.Tensor):
        raise IndexFileError(f"{path}: holds a {type(value).__name__}, not a tensor; build the index again")
    return value
