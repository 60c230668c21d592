"""The stage cut: golden stage texts, the generated methods, and a cut the pipeline cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compiler.cli import main
from compiler.codegen.emit import emit
from compiler.lowering.graph_text import stages_text
from compiler.pipeline import Options, compile_spec
from compiler.lowering.split import split_stages
from runtime.train.worker import load_module
from model_specs import SPECS, golden_stem

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # spec paths in goldens are relative to the repository


@pytest.mark.parametrize("spec", SPECS)
def test_stages_match_golden(spec: str, golden) -> None:
    lowered = compile_spec(spec, Options(world_size=2))
    golden.check(f"{golden_stem(spec)}.ws2.stages.txt", stages_text(lowered))


def test_graph_stages_prints_the_golden_text(capsys) -> None:
    assert main(["graph", "specs/dlrm_criteo.yaml", "--world-size", "2", "--stages"]) == 0
    expected = (REPO / "tests" / "golden" / "dlrm_criteo.ws2.stages.txt").read_text()
    assert capsys.readouterr().out == expected


def test_every_node_is_in_exactly_one_stage() -> None:
    lowered = compile_spec("specs/deepfm_criteo.yaml", Options(world_size=2))
    stages = lowered.stages
    names = lambda graph: [n.name for n in graph.nodes if n.op not in ("placeholder", "output")]
    whole = [n.name for n in lowered.graph.nodes if n.op not in ("placeholder", "output")]
    assert sorted(names(stages.input_dist) + names(stages.compute)) == sorted(whole)
    assert stages.cut == ("dense_int", "table_wise_ids")
    assert all(n.meta["pipeline_stage"] == 0 for n in stages.input_dist.nodes if n.op != "output")


def test_generated_methods_are_the_stage_graphs(tmp_path: Path) -> None:
    source = emit(compile_spec("specs/dlrm_criteo.yaml", Options(world_size=2))).source
    assert (
        "    def input_dist(self, dense : dict[str,torch.Tensor], sparse):\n"
        "        dense_int = dense['int'];  dense = None  # spec: specs/dlrm_criteo.yaml:7\n"
        "        table_wise_ids = self.sparse_arch.table_wise.input_dist(sparse);  sparse = None"
        "  # spec: specs/dlrm_criteo.yaml:10\n"
        "        return (dense_int, table_wise_ids)\n"
    ) in source
    assert "    def compute(self, dense_int, table_wise_ids):\n" in source
    assert "        staged = self.input_dist(dense, sparse);  dense = sparse = None\n" in source


def test_stages_in_sequence_equal_forward(tmp_path: Path) -> None:
    module = load_module(str(emit(compile_spec("specs/mmoe_multitask.yaml")).write(tmp_path)[0]))
    torch.manual_seed(0)
    model = module.build()
    batch = module.synthetic_batch(16, step=0)
    whole = model(batch.dense, batch.sparse)
    staged = model.compute(*model.input_dist(batch.dense, batch.sparse))
    assert whole.keys() == staged.keys()
    for head in whole:
        assert torch.equal(whole[head], staged[head]), head


def test_a_stage_0_node_using_stage_1_is_rejected() -> None:
    lowered = compile_spec("specs/dlrm_criteo.yaml")
    graph = lowered.graph
    ids = next(n for n in graph.nodes if n.meta.get("stage") == "input_dist")
    bottom = next(n for n in graph.nodes if n.name == "bottom")
    ids.meta["pipeline_stage"] = 1
    bottom.meta["pipeline_stage"] = 0  # the bottom MLP reads only a dense feature: still fine
    pooled = next(n for n in graph.nodes if n.meta.get("stage") == "lookup")
    pooled.meta["pipeline_stage"] = 0  # but the lookup reads the (now stage-1) input_dist
    with pytest.raises(ValueError) as error:
        split_stages(lowered)
    assert str(error.value) == (
        f"split_stages: stage-0 node %{pooled.name} ({pooled.meta['loc']}) uses stage-1 value "
        f"%{ids.name}: the pipeline cannot run it ahead"
    )
