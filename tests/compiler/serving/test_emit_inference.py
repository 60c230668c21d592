"""The generated inference module: golden text, no sharding stages, every spec lowers and imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from compiler.diagnostics import CompileError
from compiler.serving.emit import emit_inference
from compiler.serving.lower import lower_inference
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.serving.export_dir import import_module

REPO = Path(__file__).resolve().parents[3]
SPECS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "specs").glob("*.yaml"))
SEQUENCE_SPECS = ["specs/bst.yaml", "specs/din.yaml", "specs/hstu.yaml", "specs/sasrec.yaml"]  # not exported yet
POOLED_SPECS = [spec for spec in SPECS if spec not in SEQUENCE_SPECS]


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


@pytest.mark.parametrize("spec", POOLED_SPECS)
def test_every_spec_lowers_to_one_lookup_and_imports_only_torch_and_the_runtime(spec: str, tmp_path: Path) -> None:
    source = inference_source(spec, "int4")
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported == {"os", "torch", "runtime"}
    assert "input_dist" not in source and "output_dist" not in source
    assert source.count("self.sparse_arch(sparse)") == 1
    path = tmp_path / "module.py"
    path.write_text(source)
    with torch.device("meta"):
        model = import_module(path).Model()
    assert type(model.sparse_arch).__name__ == "QuantEmbeddingBagCollection"


def test_a_sequence_model_is_refused_with_a_diagnostic() -> None:
    with pytest.raises(CompileError) as caught:
        inference_source("specs/din.yaml", "int8")
    assert [str(d) for d in caught.value.diagnostics] == [
        "specs/din.yaml:14:7: error: features.sparse: sequence feature 'history': exporting models with "
        "sequence features (pooling: none) is not supported yet"
    ]
