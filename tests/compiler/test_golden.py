"""compiler/golden.py and `reccompile graph --golden FILE [--update]`: golden graphs for users."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from compiler.cli import main
from compiler.diagnostics import CompileError
from compiler.golden import GoldenMismatch, check_graph
from compiler.pipeline import Options

REPO = Path(__file__).resolve().parents[2]
TOP = "  top:         {type: mlp, input: interaction, layers: [512, 256, 1]}\n"
TOP_CHANGED = "  top:         {type: mlp, input: [interaction, bottom], layers: [512, 256, 1]}\n"
DIFF = """\
--- model.graph.txt (golden)
+++ model.yaml (graph)
@@ -10,3 +10,4 @@
   %interaction: [B, 415] = call_module interaction(%bottom, %table_wise_embeddings)  # 1:dense  model.yaml:15:3
-  %top: [B, 1] = call_module top(%interaction)  # 1:dense  model.yaml:16:3
+  %top_input: [B, 479] = call_function torch.cat([%interaction, %bottom], dim=1)  # 1:dense  model.yaml:16:3
+  %top: [B, 1] = call_module top(%top_input)  # 1:dense  model.yaml:16:3
   %click_output: [B] = call_method squeeze(%top, -1)  # 1:head  model.yaml:19:5
"""
CHANGED = "the graph of model.yaml differs from model.graph.txt (accept it with update=True):\n" + DIFF
UPDATE = "reccompile graph model.yaml --golden model.graph.txt --update"


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the DLRM spec as a user's model.yaml, in a working directory of its own."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "specs" / "dlrm_criteo.yaml", "model.yaml")
    assert TOP in Path("model.yaml").read_text()
    return tmp_path / "model.yaml"


def _change(spec: Path) -> None:
    spec.write_text(spec.read_text().replace(TOP, TOP_CHANGED))


def test_check_graph_writes_then_passes_then_fails_with_the_diff(model: Path) -> None:
    with pytest.raises(GoldenMismatch) as missing:
        check_graph("model.yaml", "model.graph.txt")
    assert str(missing.value) == "model.graph.txt does not exist: write it with update=True"
    assert str(pickle.loads(pickle.dumps(missing.value))) == str(missing.value)  # as pytest-xdist sends it
    assert check_graph("model.yaml", "model.graph.txt", update=True) is True
    golden = (REPO / "tests" / "golden" / "dlrm_criteo.ws1.graph.txt").read_text()
    assert Path("model.graph.txt").read_text() == golden.replace("specs/dlrm_criteo.yaml", "model.yaml")
    assert check_graph("model.yaml", "model.graph.txt") is False
    assert check_graph("model.yaml", "model.graph.txt", update=True) is False  # unchanged: not rewritten
    _change(model)
    with pytest.raises(GoldenMismatch) as changed:
        check_graph("model.yaml", "model.graph.txt")
    assert str(changed.value) == CHANGED
    assert isinstance(changed.value, AssertionError)  # pytest reports it as a failed assertion
    assert check_graph("model.yaml", "model.graph.txt", update=True) is True
    check_graph("model.yaml", "model.graph.txt")


@pytest.mark.parametrize(
    ("old", "new", "shows"),
    [
        ("layers: [512, 256, 1]", "layers: [1024, 256, 1]", False),  # a hidden width
        ("num_embeddings: 100000", "num_embeddings: 5000", False),
        ("pooling: sum", "pooling: mean", False),
        ("{type: adagrad, lr: 0.01}", "{type: adagrad, lr: 0.1}", False),
        ("count: 26", "count: 20", True),  # features, so the interaction's output width
        ("input: interaction, layers", "input: [interaction, bottom], layers", True),
    ],
)
def test_the_golden_shows_the_models_structure_not_what_is_inside_a_block(
    model: Path, old: str, new: str, shows: bool
) -> None:
    """What README.md says a golden graph file shows and does not."""
    check_graph("model.yaml", "model.graph.txt", update=True)
    model.write_text(model.read_text().replace(old, new))
    assert check_graph("model.yaml", "model.graph.txt", update=True) is shows


def test_check_graph_takes_the_world_size_and_the_stages(model: Path) -> None:
    check_graph("model.yaml", "ws2.stages.txt", update=True, options=Options(world_size=2), stages=True)
    golden = (REPO / "tests" / "golden" / "dlrm_criteo.ws2.stages.txt").read_text()
    assert Path("ws2.stages.txt").read_text() == golden.replace("specs/dlrm_criteo.yaml", "model.yaml")
    with pytest.raises(GoldenMismatch):
        check_graph("model.yaml", "ws2.stages.txt", options=Options(world_size=2))  # not the stages


def test_a_spec_error_is_the_specs_diagnostic(model: Path) -> None:
    model.write_text(model.read_text().replace("input: interaction", "input: interactoin"))
    with pytest.raises(CompileError) as error:
        check_graph("model.yaml", "model.graph.txt", update=True)
    assert "unknown block 'interactoin' (did you mean 'interaction'?)" in str(error.value)
    assert not Path("model.graph.txt").exists()


def test_graph_golden_command(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", "model.yaml", "--golden", "model.graph.txt"]) == 1
    assert capsys.readouterr().err == f"error: model.graph.txt does not exist: write it with {UPDATE}\n"
    assert main(["graph", "model.yaml", "--golden", "model.graph.txt", "--update"]) == 0
    assert capsys.readouterr().out == "model.graph.txt: written\n"
    assert main(["graph", "model.yaml", "--golden", "model.graph.txt"]) == 0
    assert capsys.readouterr().out == "model.graph.txt: unchanged\n"
    _change(model)
    assert main(["graph", "model.yaml", "--golden", "model.graph.txt"]) == 1
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "error: " + CHANGED.replace("update=True", UPDATE))
    assert main(["graph", "model.yaml", "--golden", "model.graph.txt", "--update"]) == 0
    assert capsys.readouterr().out == "model.graph.txt: written\n"
    assert main(["graph", "model.yaml", "--golden", "model.graph.txt"]) == 0


def test_the_command_a_golden_error_suggests_is_the_one_run_with_update(model: Path, capsys) -> None:
    argv = ["graph", "model.yaml", "--world-size", "2", "--stages", "--golden", "my golden.txt"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "error: my golden.txt does not exist: write it with "
        "reccompile graph model.yaml --world-size 2 --stages --golden 'my golden.txt' --update\n"
    )
    assert main([*argv, "--update"]) == 0
    assert main(argv) == 0


def test_update_without_golden_is_a_usage_error(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", "model.yaml", "--update"]) == 2
    assert capsys.readouterr().err == "reccompile graph: error: --update needs --golden FILE\n"
