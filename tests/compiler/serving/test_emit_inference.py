"""The generated inference module: golden text, no sharding stages, every spec lowers and imports."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from compiler.ir import Head, Input, ModelIR
from compiler.serving.emit import emit_inference
from compiler.serving.lower import lower_inference
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.serving.export_dir import import_module
from model_specs import SPECS, golden_stem

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def inference_source(spec: str, precision: str, dense: str = "fp32") -> str:
    ir = validate(load(spec))
    precisions = {table.name: precision for table in ir.tables}
    return emit_inference(lower_inference(ir, dense), precisions, dense)


@pytest.mark.parametrize("dense", ["fp32", "bf16"])
def test_dlrm_inference_module_matches_the_golden_text(golden, dense: str) -> None:
    source = inference_source("specs/dlrm_criteo.yaml", "int8", dense)
    assert source == inference_source("specs/dlrm_criteo.yaml", "int8", dense)  # byte-identical
    golden.check(f"export/dlrm_criteo.int8.{dense}.py.txt", source)


def test_an_int8_dense_module_is_the_fp32_one() -> None:
    """`--dense int8` changes how the loaded MLP blocks run (runtime/serving/packed_mlp.py), not the module."""
    assert inference_source("specs/dlrm_criteo.yaml", "int8", "int8") == inference_source(
        "specs/dlrm_criteo.yaml", "int8", "fp32"
    )


def test_a_two_tower_retrieval_module_has_its_towers_as_methods(golden) -> None:
    source = inference_source("specs/two_tower_retrieval.yaml", "fp32")
    golden.check("export/two_tower_retrieval.fp32.py.txt", source)


def _retrieval_head(ir: ModelIR) -> Head | None:
    return next((head for head in ir.heads if head.retrieval is not None), None)


def _reads_pooled(ir: ModelIR, start: Input) -> bool:
    """Whether `start` reads, through any chain of blocks, a sparse feature of a pooled (not a sequence) table."""
    sequences = {table.name for table in ir.sequence_tables()}
    stack, seen = [start], set()
    while stack:
        ref = stack.pop()
        if ref.kind == "sparse" and ir.feature(ref.name).table not in sequences:
            return True
        if ref.kind != "block" or ref.name in seen:
            continue
        seen.add(ref.name)
        block = ir.block(ref.name)
        stack += [*block.inputs, *_op_inputs(block.op)]
    return False


def _op_inputs(op: object) -> list[Input]:
    """The Inputs a block's op holds beside the block's own inputs (a query, a prepended field...)."""
    found: list[Input] = []
    for field in dataclasses.fields(op):  # type: ignore[arg-type]
        value = getattr(op, field.name)
        values = value if isinstance(value, tuple) else (value,)
        found += [item for item in values if isinstance(item, Input)]
    return found


@pytest.mark.parametrize("spec", SPECS)
def test_every_spec_lowers_to_one_lookup_per_collection_and_imports_only_torch_and_the_runtime(
    spec: str, tmp_path: Path
) -> None:
    ir = validate(load(spec))  # hstu.yaml and sasrec.yaml too: their dim-50 tables are stored padded to 52
    sequences = [table.name for table in ir.sequence_tables()]
    has_pooled = len(sequences) < len(ir.tables)
    source = inference_source(spec, "int4")
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported == {"os", "torch", "runtime"}
    assert "input_dist" not in source and "output_dist" not in source
    # forward, and for a retrieval head (two-tower or next-item) also its query and item towers; a tower
    # that reads no pooled feature (e.g. an item tower on a sequence's table) skips the bags
    methods = 3 if "RETRIEVAL = " in source else 1
    towers = [head.input, head.retrieval.item] if (head := _retrieval_head(ir)) is not None else []
    pooled_methods = 1 + sum(_reads_pooled(ir, tower) for tower in towers)
    assert source.count("self.sparse_arch(sparse)") == pooled_methods * int(has_pooled)
    assert source.count("self.sequence_arch(") == methods * int(bool(sequences))
    path = tmp_path / "module.py"
    path.write_text(source)
    with torch.device("meta"):
        model = import_module(path).Model()
    assert type(getattr(model, "sparse_arch", None)).__name__ == (
        "QuantEmbeddingBagCollection" if has_pooled else "NoneType"
    )
    assert type(getattr(model, "sequence_arch", None)).__name__ == (
        "QuantEmbeddingCollection" if sequences else "NoneType"
    )
    if sequences:
        assert model.sequence_arch.precisions() == {name: "int4" for name in sequences}
