"""Tests of compiler/spec/validate.py (and build.py, semantic.py behind it).

The invalid specs under tests/specs/invalid/ each have their exact expected
`reccompile check` output beside them (`NAME.expected`); the valid specs in
specs/ must pass and resolve to the IR the lowering relies on.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from compiler.cli import main
from compiler.diagnostics import CompileError
from compiler.ir import Dot, Mlp, ModelIR, Moe, Optimizer
from compiler.pipeline import Options, compile_spec
from compiler.spec.load import load
from compiler.spec.validate import validate

REPO = Path(__file__).resolve().parents[3]
INVALID = REPO / "tests" / "specs" / "invalid"
INVALID_SPECS = sorted(path.name for path in INVALID.glob("*.yaml"))
VALID_FILES = [*(REPO / "specs").rglob("*.yaml"), *(REPO / "tests" / "specs" / "valid").glob("*.yaml")]
VALID_SPECS = sorted(str(path.relative_to(REPO)) for path in VALID_FILES)


def resolve(spec: str, monkeypatch: pytest.MonkeyPatch) -> ModelIR:
    monkeypatch.chdir(REPO)
    return validate(load(spec))


def check_text(tmp_path: Path, text: str) -> list[str]:
    """The diagnostics of a spec written from `text`, without the file name."""
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(CompileError) as caught:
        validate(load(str(path)))
    return [str(d).split(": error: ", 1)[1] for d in caught.value.diagnostics]


def test_there_are_at_least_forty_invalid_specs() -> None:
    assert len(INVALID_SPECS) >= 40


@pytest.mark.parametrize("name", INVALID_SPECS)
def test_invalid_spec_diagnostics(name: str, golden, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(INVALID)
    status = main(["check", name])
    out, err = capsys.readouterr()
    assert (status, out) == (1, "")
    golden.check(INVALID / name.replace(".yaml", ".expected"), err)


@pytest.mark.parametrize("spec", VALID_SPECS)
def test_valid_specs_pass(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ir = resolve(spec, monkeypatch)
    assert ir.source == spec


def test_dlrm_resolves_widths_activations_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    ir = resolve("specs/dlrm_criteo.yaml", monkeypatch)
    assert [b.name for b in ir.blocks] == ["bottom", "interaction", "top"]
    assert [b.width for b in ir.blocks] == [64, 415, 1]
    bottom, interaction, top = ir.blocks
    assert bottom.op == Mlp((512, 256, 64), "relu", "relu")
    assert top.op == Mlp((512, 256, 1), "relu", "none")
    assert isinstance(interaction.op, Dot)
    assert [i.ref() for i in interaction.inputs] == ["bottom"] + [f"sparse.cat_{i}" for i in range(26)]
    assert [t.name for t in ir.tables] == [f"cat_{i}" for i in range(26)]
    assert ir.table("cat_3").features == ("cat_3",)
    assert ir.table("cat_3").init_max == pytest.approx(math.sqrt(1 / 100000))
    assert ir.sparse[3].loc == ir.sparse[0].loc  # count: every expansion points at the entry
    assert ir.heads[0].metrics == ("ne", "auc", "accuracy")
    assert ir.heads[0].label == "click"


def test_bench_specs_match_the_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    for variant, ids in (("criteo", 1), ("multihot", 20)):
        ir = resolve(f"specs/bench/dlrm_bench_{variant}.yaml", monkeypatch)
        assert [f.name for f in ir.sparse] == [f"f{i}" for i in range(26)]
        expected = [(f"t{i}", ids, True) for i in range(26)]
        assert [(f.table, f.ids_per_sample, f.fixed_ids) for f in ir.sparse] == expected
        assert {(t.num_embeddings, t.dim, t.pooling) for t in ir.tables} == {(100000, 64, "sum")}
        assert [(d.name, d.size) for d in ir.dense] == [("int", 13)]
        assert [b.width for b in ir.blocks] == [64, 415, 1]
        assert (ir.training.batch_size, ir.training.sparse_optimizer.type) == (2048, "rowwise_adagrad")
        assert (ir.training.sparse_optimizer.lr, ir.training.sparse_optimizer.eps) == (0.01, 1e-8)
        assert (ir.training.dense_optimizer.type, ir.training.dense_optimizer.eps) == ("adagrad", 1e-8)


def test_two_tower_shares_tables_and_keeps_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    ir = resolve("specs/two_tower_movielens.yaml", monkeypatch)
    genres = next(f for f in ir.sparse if f.name == "genres")
    assert (genres.table, genres.ids_per_sample, genres.fixed_ids, genres.weighted) == ("genre", 6, False, True)
    assert ir.table("genre").pooling == "mean"
    assert ir.block("score").width == 1


def test_moe_ports_reach_their_towers(monkeypatch: pytest.MonkeyPatch) -> None:
    ir = resolve("specs/mmoe_multitask.yaml", monkeypatch)
    experts = ir.block("experts")
    assert isinstance(experts.op, Moe) and experts.op.tasks == ("ctr", "cvr")
    assert ir.block("cvr_tower").inputs[0].ref() == "experts.cvr"
    assert [(h.name, h.weight) for h in ir.heads] == [("ctr", 1.0), ("cvr", 0.5)]


MINIMAL = """\
version: 1
name: minimal
features:
  dense: [{name: x, size: 3}]
model:
  b: {type: concat, input: a}
  a: {type: mlp, input: dense.x, layers: [4, 1]}
heads:
  - {name: y, input: b, loss: mse}
"""


def test_blocks_come_in_topological_order_and_defaults_are_filled(tmp_path: Path) -> None:
    path = tmp_path / "minimal.yaml"
    path.write_text(MINIMAL)
    ir = validate(load(str(path)))
    assert [b.name for b in ir.blocks] == ["a", "b"]
    assert ir.block("a").op == Mlp((4, 1), "relu", "relu")  # feeds a block, not a head
    assert ir.heads[0].metrics == ("mse", "rmse")
    assert (ir.training.batch_size, ir.training.seed, ir.training.steps) == (2048, 0, 100)
    assert (ir.training.dense_optimizer.type, ir.training.dense_optimizer.lr) == ("adagrad", 0.01)
    assert (ir.sharding.world_size, ir.sharding.device, ir.sharding.constraints) == (1, "cpu", ())
    assert ir.data is None


def test_every_table_optimizer_is_resolved_in_the_ir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    ir = validate(load("tests/specs/valid/kitchen_sink.yaml"))
    sparse = ir.training.sparse_optimizer
    assert sparse == Optimizer("adagrad", 0.05, eps=1e-6)
    own = {t.name: t.optimizer for t in ir.tables if t.optimizer != sparse}
    assert own == {"item": Optimizer("adam", 1e-3, beta2=0.99)}  # the one table with its own
    assert all(isinstance(t.optimizer, Optimizer) for t in ir.tables)


def test_sizes_in_units_become_bytes(tmp_path: Path) -> None:
    path = tmp_path / "units.yaml"
    path.write_text(MINIMAL + "sharding: {memory_per_rank: 1.5GiB, world_size: 2}\n")
    assert validate(load(str(path))).sharding.memory_per_rank == 3 << 29


def test_softmax_head_takes_its_classes_from_the_width(tmp_path: Path) -> None:
    text = MINIMAL.replace("layers: [4, 1]", "layers: [4, 5]").replace("loss: mse", "loss: softmax")
    path = tmp_path / "softmax.yaml"
    path.write_text(text)
    assert validate(load(str(path))).heads[0].num_classes == 5


def test_empty_spec_and_non_mapping_root(tmp_path: Path) -> None:
    assert check_text(tmp_path, "") == [
        "the spec is empty; expected a mapping with version, name, features, model and heads"
    ]
    assert check_text(tmp_path, "42\n") == ["expected a mapping, got 42"]


def test_a_misspelled_required_key_is_reported_once(tmp_path: Path) -> None:
    text = MINIMAL.replace("layers: [4, 1]", "layer: [4, 1]")
    assert check_text(tmp_path, text) == ["model.a.layer: unknown key 'layer' (did you mean 'layers'?)"]


CONSTRAINED = """\
version: 1
name: constrained
features:
  sparse:
    - {name: a, num_embeddings: 100, dim: 8}
model:
  top: {type: mlp, input: sparse.a, layers: [1]}
heads:
  - {name: click, input: top, loss: bce}
training: {batch_size: 8}
sharding:
  world_size: 3
  constraints:
    a: {ranks: [3]}
"""


def test_the_command_lines_world_size_is_the_one_the_spec_is_checked_against(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(CONSTRAINED)
    with pytest.raises(CompileError) as caught:
        validate(load(str(path)))
    assert sorted(d.message for d in caught.value.diagnostics) == [
        "batch_size 8 does not divide evenly over world_size 3 ranks",
        "rank 3 does not exist with world_size 3",
    ]
    assert validate(load(str(path)), world_size=4).sharding.world_size == 3  # the IR keeps the spec's
    assert compile_spec(str(path), Options(world_size=4)).ir.sharding.world_size == 4
    with pytest.raises(CompileError) as caught:
        compile_spec(str(path), Options(world_size=2))
    assert [d.message for d in caught.value.diagnostics] == ["rank 3 does not exist with world_size 2"]
