"""compiler/lowering/one_position.py: a transformer only pooled at first/last computes that position.

The fused model and the plain lowering (without the pass), built with the
same weights, give the same loss and gradients on the same batch (1e-5);
a pool of another mode, or a transformer read twice, stays as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compiler.lowering.instantiate import instantiate
from compiler.lowering.lower import lower
from compiler.lowering.one_position import read_one_position
from compiler.lowering.shapes import check_shapes
from compiler.planner.planner import plan, topology_from_ir
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.sparse.jagged import KeyedJaggedTensor

SPEC = """\
version: 1
name: tiny_bst
features:
  sparse:
    - {{name: user, num_embeddings: 20, dim: 8}}
    - {{name: item, table: items}}
    - {{name: history, table: items, pooling: none, max_length: 5}}
tables:
  - {{name: items, num_embeddings: 30, dim: 8}}
model:
  encoder: {{type: transformer, input: sparse.history, prepend: [sparse.item], num_layers: 2, num_heads: 2,
            ffn_dim: 16, norm: {norm}, causal: {causal}, positions: learned}}
  target_out: {{type: sequence_pool, input: encoder, mode: {mode}}}
  top: {{type: mlp, input: [sparse.user, target_out{extra}], layers: [8, 1]}}
heads:
  - {{name: click, input: top, loss: bce}}
training:
  batch_size: 4
"""


def lowered_pair(tmp_path: Path, **fields: str):
    spec = tmp_path / "tiny_bst.yaml"
    spec.write_text(SPEC.format(**{"norm": "post", "causal": "false", "mode": "first", "extra": "", **fields}))
    ir = validate(load(str(spec)))
    sharding_plan = plan(ir, topology_from_ir(ir))
    return check_shapes(lower(ir, sharding_plan)), check_shapes(read_one_position(lower(ir, sharding_plan)))


def batch() -> KeyedJaggedTensor:
    history = [3, 0, 5, 7]  # 7 is cut to the last 5 by the model
    ids = torch.arange(4 + 4 + sum(history)) % 20
    lengths = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, *history])
    return KeyedJaggedTensor.from_lengths_sync(["user", "item", "history"], ids, lengths)


@pytest.mark.parametrize(("mode", "norm", "causal"), [("first", "post", "false"), ("last", "pre", "true")])
def test_fused_model_trains_like_the_plain_one(tmp_path: Path, mode: str, norm: str, causal: str) -> None:
    plain, fused = lowered_pair(tmp_path, mode=mode, norm=norm, causal=causal)
    assert "target_out" in [n.name for n in plain.graph.nodes]
    assert "target_out" not in [n.name for n in fused.graph.nodes]
    assert [d.target for d in fused.modules] == [d.target for d in plain.modules if d.target != "target_out"]
    assert ("output", mode) in dict((d.target, d.call) for d in fused.modules)["encoder"].kwargs

    torch.manual_seed(0)
    reference = instantiate(plain)
    model = instantiate(fused)
    model.load_state_dict(reference.state_dict())
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    losses = []
    for module in (reference, model):
        logits = module({}, batch())["click"]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=0)
    theirs = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        if param.grad is not None or theirs[name].grad is not None:
            torch.testing.assert_close(param.grad, theirs[name].grad, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize(("mode", "read_twice"), [("mean", False), ("first", True), ("last", True)])
def test_other_pools_and_other_readers_keep_the_sequence(tmp_path: Path, mode: str, read_twice: bool) -> None:
    spec = tmp_path / "tiny_bst.yaml"
    text = SPEC.format(norm="post", causal="false", mode=mode, extra=", other" if read_twice else "")
    if read_twice:
        text = text.replace("  top:", "  other: {type: sequence_pool, input: encoder, mode: max}\n  top:")
    spec.write_text(text)
    ir = validate(load(str(spec)))
    lowered = lower(ir, plan(ir, topology_from_ir(ir)))
    before = [n.name for n in lowered.graph.nodes]
    fused = read_one_position(lowered)
    assert [n.name for n in fused.graph.nodes] == before
    assert fused.modules == lowered.modules
