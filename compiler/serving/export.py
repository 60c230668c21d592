"""Export: spec + trained checkpoint -> a self-contained serving directory.

    reccompile export SPEC --checkpoint DIR [--quantize fp16|int8|int4|none] [--per-table t=int4,...]
                           [--dense fp32|bf16|int8] -o OUT

The steps, in order:

    load + validate the spec         -> ModelIR (the same checks as compiling for training)
    resolve_precisions               -> a precision per table (--per-table wins over --quantize)
    lower_inference + emit_inference -> OUT/<name>.py, the generated serving module
    read_checkpoint                  -> the full single-process state (dense + whole tables), checked
    quantize and write               -> OUT/weights/dense.pt, OUT/weights/tables/<table>.pt, OUT/layout.json
    export_program                   -> OUT/<name>.pt2 (torch.export: lookup + dense part; not for
                                        models with sequence tables, whose row counts torch.export
                                        cannot trace)
    the checkpoint's vocab.json      -> OUT/vocab.json (MovieLens: the ids training mapped, for predict)
    the checkpoint's features.json   -> OUT/features.json (the learned feature transforms, runtime.features:
                                        predict, retrieve and a server apply them to raw fields)
    export_items (retrieval heads)   -> OUT/item_vectors.pt and OUT/index/: the item tower on every
                                        catalogue item and their nearest-neighbour index, checked
                                        against exact search (runtime/serving/item_index.py)
    manifest                         -> OUT/manifest.json, last: sizes and sha256 of every file

The directory is written next to OUT and renamed into place at the end, so
OUT is either the previous export or the complete new one. runtime/serving/export_dir.py
documents the layout and reads it back without the compiler.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from compiler import __version__
from compiler.ir import ModelIR
from compiler.serving.emit import emit_inference
from compiler.serving.lower import lower_inference
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.checkpoint.files import CheckpointError, is_checkpoint
from runtime.checkpoint.store import load_model_state, newest_intact_checkpoint, read_checkpoint_manifest
from runtime.config.transforms import Quantiles
from runtime.data.movielens.vocab import VOCABULARY_FILE, read_vocabulary
from runtime.features.state import FILE as FEATURES_FILE
from runtime.retrieval.index import FAISS_KINDS, INDEX_KINDS, faiss_available
from runtime.serving.export_dir import (
    COLLECTIONS,
    DENSE_FILE,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    ExportError,
    export_program,
    file_facts,
    import_module,
    table_collections,
    table_file,
    table_layout,
)
from runtime.serving.item_index import ItemsReport, export_items
from runtime.serving.quant_embedding import PRECISIONS, UnstorableTable, row_bytes, stored_dim
from runtime.storage.manifest import write_manifest
from runtime.storage.output import cannot_write, output_errors, save_tensors, save_to_file

QUANTIZE_CHOICES = ("none", "fp16", "int8", "int4")
TRAINING_ONLY = "retrieval_loss."  # the state-dict prefix of a retrieval head's loss module
DENSE_CHOICES = ("fp32", "bf16", "int8")


class UsageError(ExportError):
    """A command-line choice that does not fit the spec (exit status 2)."""


@dataclasses.dataclass(frozen=True)
class ExportRequest:
    spec: str
    checkpoint: Path
    outdir: Path
    quantize: str = "none"  # the precision of every table --per-table does not name
    per_table: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dense: str = "fp32"  # the dense blocks' dtype: fp32, or bf16 or int8 (not exact; see runtime/serving/packed_mlp.py)
    aot: bool = True  # also write <name>.pt2
    allow_spec_change: bool = False  # export a checkpoint trained from another version of the spec
    index: str = "auto"  # retrieval heads: the index kind (runtime.retrieval.index.INDEX_KINDS)
    eval_data: str | None = None  # retrieval heads: held-out requests for the index's recall check
    rating_threshold: float = 4.0  # MovieLens held-out data: the positives
    history: str | None = None  # next-item eval_data: the training ratings its histories are cut from


@dataclasses.dataclass(frozen=True)
class ExportResult:
    manifest: dict[str, Any]
    items: ItemsReport | None  # retrieval heads: the catalogue and the index's recall check


def export(request: ExportRequest) -> ExportResult:
    """Write the export directory of `request`; return its manifest and the retrieval report."""
    ir = validate(load(request.spec))
    _check_index_request(ir, request)
    precisions = resolve_precisions(ir, request.quantize, request.per_table)
    if request.dense not in DENSE_CHOICES:
        raise UsageError(f"--dense: {request.dense!r} is not one of {', '.join(DENSE_CHOICES)}")
    lowered = lower_inference(ir, request.dense)
    source = emit_inference(lowered, precisions, request.dense)
    checkpoint, state = read_checkpoint(request.checkpoint)
    _check_spec(ir, checkpoint, request)
    tables = table_weights(ir, state, request.checkpoint)

    with output_errors(request.outdir):
        staging = _staging_dir(request.outdir)
    try:
        module_path = staging / f"{ir.name}.py"
        module_path.write_text(source)
        module = import_module(module_path)
        model = module.Model()
        collections = table_collections(model)
        load_trained_state(model, state, tables, request.checkpoint)
        dense = {k: v for k, v in model.state_dict().items() if not _is_table_key(k)}
        (staging / "weights" / "tables").mkdir(parents=True)
        save_tensors(dense, staging / DENSE_FILE)
        for collection in collections.values():
            for name, rows in collection.table_rows().items():
                save_tensors(rows.clone(), staging / table_file(name))  # a clone: a view saves the whole buffer
        (staging / "layout.json").write_text(json.dumps(table_layout(model), indent=2) + "\n")
        # torch.export cannot trace a sequence lookup: its per-feature row counts are data-dependent.
        # A retrieval head's forward returns the training loss's inputs: it is served by query_vectors.
        traceable = not ir.sequence_tables() and not hasattr(module, "RETRIEVAL")
        aot = _write_program(model, ir, staging) if request.aot and traceable else None
        vocabulary = Path(checkpoint.get("path", request.checkpoint)) / VOCABULARY_FILE
        if vocabulary.is_file():  # the ids training mapped: predict must map them alike
            shutil.copyfile(vocabulary, staging / VOCABULARY_FILE)
        features = Path(checkpoint.get("path", request.checkpoint)) / FEATURES_FILE
        if features.is_file():  # the transforms training learned: predict applies them alike
            shutil.copyfile(features, staging / FEATURES_FILE)
        items = None
        if hasattr(module, "RETRIEVAL"):
            section, items = export_items(
                model,
                module,
                staging,
                kind=request.index,
                eval_data=request.eval_data,
                threshold=request.rating_threshold,
                history=request.history,
                vocabulary=read_vocabulary(vocabulary) if vocabulary.is_file() else None,
                features=staging / FEATURES_FILE if features.is_file() else None,
            )
        manifest = _manifest(ir, precisions, checkpoint, request, staging, dense, aot)
        if items is not None:
            manifest["retrieval"] = section
        write_manifest(staging / MANIFEST, manifest)
    except OSError as error:  # a full disk, a read-only folder: one line, and nothing left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise cannot_write(request.outdir, error) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        _replace(request.outdir, staging)
    except OSError as error:  # another export renamed OUT at the same moment: this one goes
        shutil.rmtree(staging, ignore_errors=True)
        raise cannot_write(request.outdir, error) from None
    return ExportResult(manifest, items)


def _check_index_request(ir: ModelIR, request: ExportRequest) -> None:
    """--index and --eval-data belong to retrieval models; a faiss kind needs faiss."""
    retrieval = any(head.retrieval is not None for head in ir.heads)
    if not retrieval and (request.index != "auto" or request.eval_data is not None):
        raise UsageError(f"--index and --eval-data are for retrieval models: {ir.source} has no sampled_softmax head")
    if request.history is not None and request.eval_data is None:
        raise UsageError("--history is where --eval-data's histories come from: give --eval-data too")
    if request.index not in INDEX_KINDS:
        raise UsageError(f"--index: {request.index!r} is not one of {', '.join(INDEX_KINDS)}")
    if request.index in FAISS_KINDS and not faiss_available():
        raise UsageError(
            f"--index {request.index} needs faiss, which is not installed (pip install 'reccompile[faiss]'); "
            "--index exact needs none"
        )


def load_trained_state(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], tables: Mapping[str, torch.Tensor], where: Path
) -> None:
    """Fill a serving model (eval mode after) from a trained model's full single-process state
    and its whole tables (`table_weights`); `where` names the state's source in errors."""
    with torch.no_grad():
        # Keys and shapes checked by _dense_state; values cast to the dense dtype; the tables next.
        model.load_state_dict(_dense_state(model, state, where), strict=False)
        for collection in table_collections(model).values():
            try:
                collection.quantize_from({name: tables[name] for name in collection.precisions()})
            except UnstorableTable as error:
                raise ExportError(f"{where}: {error}") from None
    model.eval()


def resolve_precisions(ir: ModelIR, quantize: str, per_table: Mapping[str, str]) -> dict[str, str]:
    """Table -> precision (any dim: runtime/serving/quant_embedding.py pads rows to fbgemm's multiple of 4)."""
    default = "fp32" if quantize == "none" else quantize
    names = [t.name for t in ir.tables]
    for name, precision in per_table.items():
        if name not in names:
            raise UsageError(f"--per-table: {ir.source} has no table {name!r} (tables: {', '.join(names)})")
        if precision not in PRECISIONS:
            raise UsageError(
                f"--per-table: {name}={precision}: unknown precision (expected one of {', '.join(PRECISIONS)})"
            )
    return {t.name: per_table.get(t.name, default) for t in ir.tables}


# -- the checkpoint ---------------------------------------------------------------


def read_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The manifest and full single-process model state of a checkpoint (or of the latest one in a
    directory of them), read by runtime.checkpoint.store without a process group.

    A damaged latest one is an error, not passed over as a resume does (an export of an older model
    than asked for would go unnoticed); the error names the newest intact one to pass instead."""
    try:
        return read_checkpoint_manifest(directory), load_model_state(directory)
    except CheckpointError as error:
        intact = None if is_checkpoint(directory) else newest_intact_checkpoint(directory)
        if intact is None:
            raise
        raise CheckpointError(
            f"{error}; the newest intact checkpoint there is {intact}: pass --checkpoint {intact} to export it"
        ) from None


def _check_spec(ir: ModelIR, checkpoint: Mapping[str, Any], request: ExportRequest) -> None:
    trained = checkpoint.get("spec_sha256")
    if trained != ir.source_sha256 and not request.allow_spec_change:
        raise ExportError(
            f"{request.checkpoint}: trained from a spec with sha256 {str(trained)[:12]}…, but {request.spec} "
            f"has {ir.source_sha256[:12]}… "
            "(pass --allow-spec-change to export it anyway; shapes are still checked)"
        )


def table_weights(ir: ModelIR, state: Mapping[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """Table -> its whole weight in a trained model's full state, checked against the spec."""
    tables = {}
    for table in ir.tables:
        key = f"sparse_arch.{table.name}.weight"
        if key not in state:
            raise ExportError(f"{where}: the checkpoint has no {key} (table {table.name!r} of {ir.source})")
        weight = state[key]
        if tuple(weight.shape) != (table.num_embeddings, table.dim):
            raise ExportError(
                f"{where}: {key} is {tuple(weight.shape)}, but table {table.name!r} of {ir.source} is "
                f"({table.num_embeddings}, {table.dim})"
            )
        tables[table.name] = weight
    return tables


def _dense_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's dense entries, exactly the keys and shapes of the serving model's."""
    expected = {k: v for k, v in model.state_dict().items() if not _is_table_key(k)}
    # The retrieval loss's state (its sampling step, its logQ counts) serves nothing.
    given = {k: v for k, v in state.items() if not _is_table_key(k) and not k.startswith(TRAINING_ONLY)}
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unexpected {', '.join(unexpected)}"] if unexpected else []
        )
        raise ExportError(f"{where}: the dense parameters do not fit the spec: {'; '.join(parts)}")
    for key, tensor in expected.items():
        if given[key].shape != tensor.shape:
            raise ExportError(
                f"{where}: {key} is {tuple(given[key].shape)} in the checkpoint, {tuple(tensor.shape)} in the spec"
            )
    return {k: given[k] for k in expected}


def _is_table_key(key: str) -> bool:
    """A table's entry: the training model holds every table under `sparse_arch.`, the serving
    model the pooled ones there and the sequence ones under `sequence_arch.`."""
    return key.split(".", 1)[0] in COLLECTIONS


# -- writing ------------------------------------------------------------------------


def _write_program(model: torch.nn.Module, ir: ModelIR, staging: Path) -> dict[str, Any]:
    sparse_keys = [f for t in ir.tables for f in t.features]
    weighted = any(f.weighted for f in ir.sparse)
    program = export_program(model, {f.name: f.size for f in ir.dense}, sparse_keys, weighted)
    with warnings.catch_warnings():
        # The tables' rows are views of one buffer, none of them whole: torch's packaging warns,
        # then stores the span of the buffer they cover (the zoo test runs every .pt2 against the
        # served module).
        warnings.filterwarnings("ignore", message="No complete tensor found in the group")
        save_to_file(staging / f"{ir.name}.pt2", lambda stream: torch.export.save(program, stream))
    return {
        "file": f"{ir.name}.pt2",
        "inputs": {
            "dense": {f.name: [None, f.size] for f in ir.dense},
            "values": "int64 ids of all sparse features, key after key in sparse_keys order",
            "lengths": "int64 ids per (key, sample), key-major: len(sparse_keys) * batch",
            "weights": "float32 per-id weights, like values" if weighted else None,
        },
        "sparse_keys": sparse_keys,
        **_derived(ir),
        "outputs": {head.name: "logits" if head.loss != "mse" else "values" for head in ir.heads},
        "requires": ["torch", "fbgemm_gpu"],
    }


def _derived(ir: ModelIR) -> dict[str, Any]:
    """The sparse keys a caller derives from data columns (runtime.data.feature_columns), if any:
    a copy of another key's ids, or a dense column bucketized (torch.bucketize, right=True, of the
    float32 column on the boundaries as float32)."""
    derived = {}
    for f in ir.sparse:
        if f.boundaries:
            derived[f.name] = {"bucketize": f.column, "column": f.column_index, "boundaries": list(f.boundaries)}
        elif f.column is not None and not isinstance(f.transform, Quantiles):  # learned buckets: features.json
            derived[f.name] = {"copy_of": f.column}
    return {"derived_keys": derived} if derived else {}


def _manifest(
    ir: ModelIR,
    precisions: Mapping[str, str],
    checkpoint: Mapping[str, Any],
    request: ExportRequest,
    staging: Path,
    dense: Mapping[str, torch.Tensor],
    aot: dict[str, Any] | None,
) -> dict[str, Any]:
    def facts(file: str) -> dict[str, Any]:
        return {"file": file, **file_facts(staging / file)}

    tables = []
    sequences = {table.name for table in ir.sequence_tables()}
    for table in ir.tables:
        precision = precisions[table.name]
        tables.append(
            {
                "name": table.name,
                "rows": table.num_embeddings,
                "dim": table.dim,
                "pooling": table.pooling,
                "lookup": "rows" if table.name in sequences else "pooled",  # rows: sequence_arch
                "features": list(table.features),
                "precision": precision,
                "row_bytes": row_bytes(stored_dim(table.dim), precision),  # padded to a multiple of 4 values
                "fp32_bytes": table.num_embeddings * table.dim * 4,
                **facts(table_file(table.name)),
            }
        )
    on_disk = sum(t["bytes"] for t in tables)
    fp32 = sum(t["fp32_bytes"] for t in tables)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": ir.name,
        "compiler_version": __version__,
        "spec": {"path": ir.source, "sha256": ir.source_sha256},
        "checkpoint": {
            "directory": str(checkpoint.get("path", request.checkpoint)),
            "spec_sha256": checkpoint.get("spec_sha256"),
            "step": checkpoint.get("step"),
            "world_size": checkpoint.get("world_size"),
        },
        "module": facts(f"{ir.name}.py"),
        "layout": facts("layout.json"),
        "dense": {
            **facts(DENSE_FILE),
            "parameters": sum(t.numel() for t in dense.values()),
            "dtype": request.dense,
        },
        "tables": tables,
        "tables_bytes": on_disk,
        "tables_fp32_bytes": fp32,
        "tables_compression": round(fp32 / on_disk, 3) if on_disk else None,
        "aot": None if aot is None else {**aot, **file_facts(staging / aot["file"])},
        "vocabulary": facts(VOCABULARY_FILE) if (staging / VOCABULARY_FILE).is_file() else None,
        **({"features": facts(FEATURES_FILE)} if (staging / FEATURES_FILE).is_file() else {}),
        "heads": [{"name": h.name, "loss": h.loss, "label": h.label, "num_classes": h.num_classes} for h in ir.heads],
    }


def _staging_dir(outdir: Path) -> Path:
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise ExportError(f"{outdir} exists and is not a directory")
    if outdir.is_dir() and any(outdir.iterdir()) and not _is_export(outdir):
        raise ExportError(f"{outdir} exists and is not an export directory; choose another -o or empty it")
    staging = outdir.parent / f".{outdir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _is_export(directory: Path) -> bool:
    """Whether `directory` holds an export (of any format version), which a new export may replace;
    a checkpoint's directory has a manifest.json too."""
    try:
        return json.loads((directory / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def _replace(outdir: Path, staging: Path) -> None:
    """Put `staging` at `outdir`; a previous export there is removed only once the new one is complete."""
    outdir = Path(outdir)
    if outdir.exists():
        retired = outdir.parent / f".{outdir.name}.old-{os.getpid()}"
        outdir.rename(retired)
        staging.rename(outdir)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(outdir)
