"""compiler/spec/groups.py and block_options.py: what a valid spec resolves to in the IR."""

from __future__ import annotations

from pathlib import Path

from compiler.ir import Activation, Mlp, Moe, Product
from compiler.spec.load import load
from compiler.spec.validate import validate

SPEC = """\
version: 1
name: options
features:
  dense:
    - {name: age, size: 4}
  sparse:
    - {name: user_id, num_embeddings: 100, dim: 8}
    - {name: item_id, num_embeddings: 100, dim: 8}
groups:
  user: [dense.age, sparse.user_id]
  item: [sparse.item_id]
model:
  experts: {type: moe, input: [groups.item, groups.user], num_experts: 2, task_experts: 1, levels: 3,
            expert_layers: [16], tasks: [ctr, cvr]}
  ctr_tower: {type: mlp, input: experts.ctr, layers: [16, 1], norm: batch, dropout: 0.25, residual: true}
  cvr_tower: {type: mlp, input: experts.cvr, layers: [16, 1]}
  ctr_p: {type: activation, input: ctr_tower, fn: sigmoid}
  ctcvr_p: {type: product, input: [ctr_p, cvr_tower]}
heads:
  - {name: ctr, input: ctr_tower, loss: bce}
  - {name: ctcvr, input: ctcvr_p, loss: bce, output: probability}
"""


def test_the_ir_holds_groups_options_ple_and_probability_heads(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    ir = validate(load(str(path)))
    experts = ir.block("experts")
    assert [item.ref() for item in experts.inputs] == ["sparse.item_id", "dense.age", "sparse.user_id"]
    assert experts.op == Moe(2, (16,), ("ctr", "cvr"), "relu", task_experts=1, levels=3)
    assert experts.op.is_ple
    assert ir.block("ctr_tower").op == Mlp((16, 1), "relu", "none", "batch", 0.25, True)
    # an mlp read by a probability head ends with sigmoid; one read by nothing else with its activation
    assert ir.block("cvr_tower").op == Mlp((16, 1), "relu", "relu")
    assert not ir.block("cvr_tower").op.decorated
    assert ir.block("ctr_p").op == Activation("sigmoid") and ir.block("ctr_p").width == 1
    assert ir.block("ctcvr_p").op == Product() and ir.block("ctcvr_p").width == 1
    assert [head.output for head in ir.heads] == ["logit", "probability"]


def test_an_mlp_read_by_a_probability_head_defaults_to_sigmoid(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace("input: ctcvr_p, loss: bce", "input: cvr_tower, loss: bce"))
    text = path.read_text().replace("  ctr_p: {type: activation, input: ctr_tower, fn: sigmoid}\n", "")
    path.write_text(text.replace("  ctcvr_p: {type: product, input: [ctr_p, cvr_tower]}\n", ""))
    ir = validate(load(str(path)))
    assert ir.block("cvr_tower").op.final_activation == "sigmoid"


def test_ple_levels_of_different_sizes_resolve_per_level(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        SPEC.replace(
            "num_experts: 2, task_experts: 1, levels: 3,",
            "num_experts: 2, task_experts: 1, per_level: [{num_experts: 4, expert_layers: [32]}, {task_experts: 2}],",
        )
    )
    ir = validate(load(str(path)))
    experts = ir.block("experts")
    assert experts.op.levels == 2 and experts.op.per_level == ((4, 1, (32,)), (2, 2, (16,)))
    assert experts.width == 16 and ir.block("ctr_tower").inputs[0].width == 16
