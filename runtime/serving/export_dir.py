"""Serving an export directory: its manifest, its weights, its ahead-of-time program.

`reccompile export` writes a directory (see compiler/serving/export.py) that this
module reads without the compiler:

    manifest.json         what is there: spec hash, precision and size per table, sha256 per file
    <name>.py             the generated inference module (`build()` -> the eval model)
    layout.json           the single-process table layout (byte offsets, features, columns);
                          the sequence tables' under "sequence" (see `table_layout`)
    weights/dense.pt      the dense parameters (torch.save of a dict of tensors)
    weights/tables/T.pt   table T's stored rows (uint8, fbgemm's row layout)
    <name>.pt2            torch.export program of lookup + dense part (torch + fbgemm_gpu only)
    vocab.json            the MovieLens vocabulary training mapped ids with (when it had one)
    features.json         the learned feature transforms (runtime.features), when the spec has some:
                          `learned_inputs(directory, module.INPUTS)` applies them to raw fields

Every file is checked against the manifest before use (size always, sha256
unless `verify=False`), and every failure is an `ExportError` whose message
names the file and says what to do. Weights load with
`torch.load(weights_only=True)`: an export directory runs no pickled code.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.fx.experimental import _config as fx_config  # backed_size_oblivious: see AotModel

from runtime.config.heads import HeadConfig
from runtime.serving.packed_mlp import pack_mlps
from runtime.sparse.jagged import KeyedJaggedTensor
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
)

__all__ = [
    "DENSE_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "AotModel",
    "COLLECTIONS",
    "ExportError",
    "checked_file",
    "export_program",
    "file_facts",
    "head_scores",
    "import_module",
    "load",
    "load_tensors",
    "load_weights",
    "read_export_manifest",
    "table_collections",
    "table_file",
    "table_layout",
]

FORMAT = "reccompile-export"
FORMAT_VERSION = 1
EXPORT = Artifact("export", "an", "write one with reccompile export", "export again", FORMAT_VERSION)
DENSE_FILE = "weights/dense.pt"
TABLES_DIR = "weights/tables"
# The serving model's quantized collections: the pooled tables', the sequence tables'.
COLLECTIONS = ("sparse_arch", "sequence_arch")


class ExportError(Exception):
    """An export directory is missing, incomplete, corrupted or mixed from several exports."""


def table_file(table: str) -> str:
    return f"{TABLES_DIR}/{table}.pt"


def read_export_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of an export directory, its format checked (files are checked on use)."""
    root = Path(directory)
    if not root.is_dir():
        raise ExportError(f"export directory {root} does not exist")
    try:
        return read_manifest(root / MANIFEST, FORMAT, FORMAT_VERSION)
    except ManifestProblem as problem:
        raise ExportError(manifest_message(problem, root, EXPORT)) from None


def checked_file(root: Path, entry: Mapping[str, Any], verify: bool = True) -> Path:
    """The path of a manifest entry's file after checking its size (and sha256 when `verify`)."""
    try:
        check_file(root / entry["file"], entry, verify)
    except FileProblem as problem:
        raise ExportError(file_message(problem, EXPORT)) from None
    return root / entry["file"]


def load_tensors(root: Path, entry: Mapping[str, Any], verify: bool = True) -> Any:
    """torch.load (weights only, memory-mapped) of a checked manifest entry."""
    path = checked_file(root, entry, verify)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # a corrupt zip, a pickle with code in it, ...
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ExportError(f"{path}: cannot be read ({first}); export again") from None


def table_collections(model: nn.Module) -> dict[str, nn.Module]:
    """The collections `model` holds, by attribute (`sparse_arch`, then `sequence_arch`)."""
    return {name: getattr(model, name) for name in COLLECTIONS if getattr(model, name, None) is not None}


def table_layout(model: nn.Module) -> dict[str, Any]:
    """What layout.json holds: the pooled collection's layout ({"tables": []} without one), with the
    sequence collection's under "sequence" when the model has sequence tables."""
    collections = table_collections(model)
    layout = collections["sparse_arch"].layout() if "sparse_arch" in collections else {"tables": []}
    if "sequence_arch" in collections:
        layout = {**layout, "sequence": collections["sequence_arch"].layout()}
    return layout


@torch.no_grad()
def load_weights(model: nn.Module, directory: str | Path, spec_sha256: str, verify: bool = True) -> None:
    """Fill a generated inference `Model` with the weights of `directory`, checked on the way; its plain
    MLP blocks then serve from weights packed once (runtime/serving/packed_mlp.py): as the trained model
    computes them if every table is fp32, the faster way on this machine otherwise (int8 layers among
    the ways if the export's dense dtype is int8)."""
    root = Path(directory)
    manifest = read_export_manifest(root)
    if manifest["spec"]["sha256"] != spec_sha256:
        raise ExportError(
            f"{root}: {MANIFEST} is for spec sha256 {manifest['spec']['sha256'][:12]}… but the module was "
            f"generated from {spec_sha256[:12]}…; the files come from different exports"
        )
    checked_file(root, manifest["module"], verify)
    state = dict(load_tensors(root, manifest["dense"], verify))
    precisions, holders = {}, {}
    for attribute, collection in table_collections(model).items():
        for name, precision in collection.precisions().items():
            precisions[name], holders[name] = precision, attribute
    listed = {table["name"]: table for table in manifest["tables"]}
    if sorted(listed) != sorted(precisions):
        raise ExportError(
            f"{root}: {MANIFEST} lists tables {list(listed)} but the module has {list(precisions)}; "
            "the files come from different exports"
        )
    for name, precision in precisions.items():
        if listed[name]["precision"] != precision:
            raise ExportError(
                f"{root}: table {name!r} is {listed[name]['precision']} in {MANIFEST} but {precision} in "
                "the module; the files come from different exports"
            )
        state[f"{holders[name]}.{name}.packed"] = load_tensors(root, listed[name], verify)
    _check_layout(root, manifest, model, verify)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ExportError(f"{root}: the weights do not fit the module: {error}") from None
    int8 = manifest["dense"].get("dtype") == "int8"  # `export --dense int8`
    pack_mlps(model, exact=not int8 and all(precision == "fp32" for precision in precisions.values()), int8=int8)


def _check_layout(root: Path, manifest: Mapping[str, Any], model: nn.Module, verify: bool) -> None:
    """layout.json is the manifest's (size, sha256) and describes the module's tables."""
    path = checked_file(root, manifest["layout"], verify)
    try:
        saved = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{path}: not valid JSON ({error}); export again") from None
    expected = json.loads(json.dumps(table_layout(model)))
    if saved != expected:
        raise ExportError(f"{path}: describes other tables than the module's; the files come from different exports")


def import_module(path: str | Path) -> ModuleType:
    """Import a generated module from its file (not entered in sys.modules)."""
    file = Path(path)
    spec = importlib.util.spec_from_file_location(f"reccompile_export_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ExportError(f"{file}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def data_file(directory: str | Path, key: str, verify: bool = True) -> Path | None:
    """The checked path of a data file the manifest lists under `key` ("vocabulary"), or None."""
    root = Path(directory)
    entry = read_export_manifest(root).get(key)
    return None if entry is None else checked_file(root, entry, verify)


def load(directory: str | Path, verify: bool = True) -> tuple[ModuleType, nn.Module]:
    """The generated module of an export directory and its eval model with the weights loaded."""
    root = Path(directory)
    manifest = read_export_manifest(root)
    module = import_module(checked_file(root, manifest["module"], verify))
    return module, module.build(root, verify=verify)


def head_scores(outputs: Mapping[str, torch.Tensor], heads: Sequence[HeadConfig]) -> dict[str, torch.Tensor]:
    """Per head: sigmoid of the logit (bce), the probability as it is (bce with output probability),
    softmax over classes (softmax), the value (mse)."""
    scores = {}
    for head in heads:
        output = outputs[head.name]
        if head.loss == "bce" and not head.probability:
            scores[head.name] = torch.sigmoid(output)
        elif head.loss == "softmax":
            scores[head.name] = torch.softmax(output, dim=1)
        else:
            scores[head.name] = output
    return scores


# The ahead-of-time program: the same forward on plain tensors, through torch.export.


class AotModel(nn.Module):
    """`forward(dense, values, lengths[, weights])` over an inference model, for torch.export.

    The sparse ids come as one KeyedJaggedTensor's tensors with the keys in
    `sparse_keys` order (the collection's own order, so no permute is traced);
    the program returns the model's outputs, {head: logits or values}.

    A single request must work, and torch.export assumes a dynamic size is
    never 1: ops whose strides would differ at batch 1 (fbgemm's lookup meta
    function, a width-1 column of a pooled tensor) guard the program on
    `batch != 1`. So the model runs on one sample more than asked, a zero
    dense row with no ids whose outputs are dropped, and its batch is at
    least 2 by construction; the few tensors of the asked batch size in this
    wrapper are traced size-obliviously (see export_program). A single
    request costs two samples' work.
    """

    def __init__(self, model: nn.Module, sparse_keys: Sequence[str], weighted: bool) -> None:
        super().__init__()
        self.model = model
        self.sparse_keys = list(sparse_keys)
        self.weighted = weighted

    def forward(
        self,
        dense: dict[str, torch.Tensor],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        weights = weights if self.weighted else None
        dense = {name: nn.functional.pad(x, (0, 0, 0, 1)) for name, x in dense.items()}
        if self.sparse_keys:  # key-major lengths: a 0 after each key's
            lengths = nn.functional.pad(lengths.view(len(self.sparse_keys), -1), (0, 1)).flatten()
        sparse = KeyedJaggedTensor(self.sparse_keys, values, weights, lengths=lengths)
        return {head: output[:-1] for head, output in self.model(dense, sparse).items()}


def export_program(
    model: nn.Module,
    dense_sizes: Mapping[str, int],
    sparse_keys: Sequence[str],
    weighted: bool,
) -> torch.export.ExportedProgram:
    """torch.export of `AotModel(model)` with the batch size and the id count left dynamic.

    Traced with `backed_size_oblivious` (torch's documented switch against
    0/1 specialization), under which stride checks assume a dynamic size is
    not 1 instead of guarding on it. Its caveat, a broadcast against a size
    that turns out to be 1, cannot arise: the model's batch is at least 2,
    and the wrapper broadcasts nothing."""
    wrapper = AotModel(model, sparse_keys, weighted).eval()
    batch, ids = 3, 3 * len(sparse_keys)
    example = (
        {name: torch.zeros(batch, size) for name, size in dense_sizes.items()},
        torch.zeros(ids, dtype=torch.long),
        torch.ones(batch * len(sparse_keys), dtype=torch.long),
        torch.ones(ids) if weighted else None,
    )
    samples = torch.export.Dim("batch", min=1, max=1 << 24)
    count = torch.export.Dim("ids", min=0, max=1 << 31)
    dynamic = (
        {name: {0: samples} for name in dense_sizes},
        {0: count},
        {0: len(sparse_keys) * samples} if sparse_keys else None,
        {0: count} if weighted else None,
    )
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        return torch.export.export(wrapper, example, dynamic_shapes=dynamic)
