"""Lowering: golden graphs for every spec, and shape errors reported at the spec line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compiler.diagnostics import CompileError
from compiler.lowering.graph_text import graph_text
from compiler.lowering.lower import lower
from compiler.pipeline import Options, compile_spec
from compiler.planner.planner import plan, topology_from_ir
from compiler.lowering.shapes import check_shapes
from compiler.spec.load import load
from compiler.spec.validate import validate
from model_specs import SPECS, golden_stem

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # spec paths in goldens are relative to the repository


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("spec", SPECS)
def test_graph_matches_golden(spec: str, world_size: int, golden) -> None:
    lowered = compile_spec(spec, Options(world_size=world_size))
    golden.check(f"{golden_stem(spec)}.ws{world_size}.graph.txt", graph_text(lowered))


def test_graph_has_the_distributed_stages_in_order() -> None:
    lowered = compile_spec("specs/dlrm_criteo.yaml")
    stages = [n.meta["stage"] for n in lowered.graph.nodes if n.op != "output"]
    first = {stage: stages.index(stage) for stage in ("input_dist", "lookup", "output_dist", "head")}
    assert first["input_dist"] < first["lookup"] < first["output_dist"] < first["head"]
    for node in lowered.graph.nodes:
        if node.op != "output":
            assert node.meta["loc"].file == "specs/dlrm_criteo.yaml"


def _dlrm_ir():
    ir = validate(load("specs/dlrm_criteo.yaml"))
    return ir, plan(ir, topology_from_ir(ir))


def test_width_mismatch_is_reported_at_the_block() -> None:
    ir, sharding_plan = _dlrm_ir()
    top = ir.block("top")
    wrong_input = dataclasses.replace(top.inputs[0], width=400)  # the real width is 415
    broken = dataclasses.replace(
        ir, blocks=tuple(dataclasses.replace(b, inputs=(wrong_input,)) if b.name == "top" else b for b in ir.blocks)
    )
    with pytest.raises(CompileError) as error:
        check_shapes(lower(broken, sharding_plan))
    assert str(error.value) == (
        f"specs/dlrm_criteo.yaml:{top.loc.line}:{top.loc.col}: error: model.top: shapes do not fit: "
        "the block takes width 400 but its inputs give 415 (node %top)\n"
        "1 error"
    )


def test_head_of_the_wrong_width_is_reported_at_the_head() -> None:
    ir, sharding_plan = _dlrm_ir()
    top = ir.block("top")
    wide_top = dataclasses.replace(top, op=dataclasses.replace(top.op, layers=(512, 256, 2)), width=2)
    broken = dataclasses.replace(ir, blocks=tuple(wide_top if b.name == "top" else b for b in ir.blocks))
    head = ir.heads[0]
    with pytest.raises(CompileError) as error:
        check_shapes(lower(broken, sharding_plan))
    assert str(error.value) == (
        f"specs/dlrm_criteo.yaml:{head.loc.line}:{head.loc.col}: error: heads.click: "
        "a bce head needs [B] per batch, but its input gives [B, 2]\n1 error"
    )
