"""compiler/spec/module_names.py: the names a block cannot take are every name the generated models hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import fx

from compiler.pipeline import generate
from compiler.serving.emit import emit_inference
from compiler.serving.lower import lower_inference
from compiler.spec.load import load
from compiler.spec.module_names import GENERATED, TORCH_MODULE, module_name_clash, numeric_embedding_name
from compiler.spec.validate import validate
from model_specs import SPECS

REPO = Path(__file__).resolve().parents[3]


def test_the_torch_names_are_every_public_attribute_of_a_graph_module() -> None:
    module = fx.GraphModule(torch.nn.Module(), fx.Graph())
    public = {name for name in {*dir(fx.GraphModule), *vars(module)} if not name.startswith("_")}
    assert public <= TORCH_MODULE, sorted(public - TORCH_MODULE)


def _model_names(source: str) -> set[str]:
    """The methods of the source's class Model and the attributes its methods assign on self."""
    model = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Model")
    methods = {node.name for node in model.body if isinstance(node, ast.FunctionDef)}
    assigned = {
        target.attr
        for node in ast.walk(model)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }
    return methods | assigned


@pytest.mark.parametrize("spec", SPECS)
def test_a_generated_model_holds_only_its_blocks_and_the_reserved_names(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    ir = validate(load(spec))
    dense = [feature.name for feature in ir.dense]
    training = _model_names(generate(spec).source)
    precisions = {table.name: "fp32" for table in ir.tables}
    serving = _model_names(emit_inference(lower_inference(ir, "fp32"), precisions, "fp32"))
    blocks = {block.name for block in ir.blocks}
    held = {
        name for name in training | serving if not name.startswith("_")
    } - blocks  # a block's name starts with a letter
    assert held <= {*GENERATED, *(numeric_embedding_name(name) for name in dense), "forward"}
    for name in held:
        assert module_name_clash(name, dense) is not None, name


def test_other_names_are_free() -> None:
    assert module_name_clash("top", ["int"]) is None
    assert module_name_clash("dense_int", ["int"]) is None  # what fx names the feature's node, not a module
    assert module_name_clash("dense_other_embedding", ["int"]) is None
