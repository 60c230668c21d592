"""Field stacks and multi-vector blocks in the lowered graph: what each node computes, against its formula.

Runs small specs through the whole compiler and the in-memory GraphModule,
records every node's value with an fx Interpreter, and checks the blocks
that read several vectors (sum, dot_product, dot, fm) and the stack nodes
against formulas over the embeddings they read. Also pins #17 §4: these
blocks over adjacent sparse features compile at world sizes 1 and 2 without
the shape check's last resort (a Python exception's text as a diagnostic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx

import compiler.lowering.shapes as shapes
from compiler.lowering.instantiate import instantiate, model_inputs
from compiler.pipeline import Options, compile_spec
from runtime.data.synthetic.batches import make_batch

SPEC = """\
version: 1
name: blocks
features:
  dense:
    - {name: num, size: 3, embed: {dim: 4, bias: true}}
    - {name: raw, size: 5}
  sparse:
    - {name: a, num_embeddings: 50, dim: 4}
    - {name: b, num_embeddings: 50, dim: 4}
    - {name: c, num_embeddings: 50, dim: 4}
model:
  bottom:  {type: mlp, input: dense.raw, layers: [4]}
  total:   {type: sum, input: [sparse.a, sparse.b, sparse.c]}
  score:   {type: dot_product, input: [sparse.b, sparse.c]}
  fields:  {type: stack, input: [sparse.a, sparse.b, bottom, dense.num]}
  pairs:   {type: dot, input: [bottom, fields]}
  fm:      {type: fm, input: fields}
  flat:    {type: flatten, input: fields}
  att:     {type: self_attention, input: fields, num_layers: 1, num_heads: 2, attention_dim: 2}
  att_out: {type: flatten, input: att}
  cin:     {type: cin, input: fields, layer_sizes: [4, 2]}
  wk:      {type: wukong, input: fields, num_fmb: 2, num_lcb: 1, rank: 2}
  wk_out:  {type: flatten, input: wk}
  masks:   {type: mask_block, input: fields, mode: serial, block_sizes: [6, 3]}
  top:     {type: mlp, input: [total, score, pairs, fm, flat, att_out, cin, wk_out, masks], layers: [1]}
heads:
  - {name: click, input: top, loss: bce}
"""


class _Recorder(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.values: dict[str, Any] = {}

    def run_node(self, node: fx.Node) -> Any:
        result = super().run_node(node)
        self.values[node.name] = result
        return result


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "blocks.yaml"
    path.write_text(SPEC)
    return str(path)


def _run(spec: str) -> dict[str, Any]:
    lowered = compile_spec(spec)
    torch.manual_seed(0)
    module = instantiate(lowered)
    batch = make_batch(model_inputs(lowered.ir), batch_size=6, step=0)
    recorder = _Recorder(module)
    with torch.no_grad():
        recorder.run(batch.dense, batch.sparse)
    recorder.values["input.num"] = batch.dense["num"]
    recorder.values["module"] = module
    return recorder.values


def test_sum_and_dot_product_read_adjacent_sparse_features_one_by_one(spec: str) -> None:
    values = _run(spec)
    embeddings = values["table_wise_embeddings"]
    a, b, c = embeddings["a"], embeddings["b"], embeddings["c"]
    torch.testing.assert_close(values["total"], a + b + c, rtol=0, atol=1e-6)
    torch.testing.assert_close(values["score"], (b * c).sum(dim=1, keepdim=True), rtol=0, atol=1e-6)


def test_a_stack_is_its_inputs_fields_in_order_and_dot_and_fm_read_its_fields(spec: str) -> None:
    values = _run(spec)
    embeddings, module = values["table_wise_embeddings"], values["module"]
    embedded = module.dense_num_embedding
    num = values["input.num"]
    numeric = num.unsqueeze(2) * embedded.weight + embedded.bias  # [B, 3, 4]
    bottom = values["bottom"]
    expected = torch.cat([embeddings["a"][:, None], embeddings["b"][:, None], bottom[:, None], numeric], dim=1)
    assert values["fields"].shape == (6, 6, 4)
    torch.testing.assert_close(values["fields"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(values["flat"], expected.reshape(6, 24), rtol=0, atol=0)
    vectors = torch.cat([bottom[:, None], expected], dim=1)  # dot: bottom, then the stack's 6 fields
    gram = vectors @ vectors.transpose(1, 2)
    rows, cols = torch.triu_indices(7, 7, offset=1)
    torch.testing.assert_close(values["pairs"], torch.cat([bottom, gram[:, rows, cols]], dim=1), rtol=0, atol=1e-5)
    pairwise = sum((expected[:, i] * expected[:, j]).sum(dim=1) for i in range(6) for j in range(i + 1, 6))
    torch.testing.assert_close(values["fm"][:, 0], pairwise, rtol=0, atol=1e-5)


def test_the_stack_blocks_get_the_stack_and_give_their_widths(spec: str) -> None:
    values = _run(spec)
    fields = values["fields"]
    module = values["module"]
    for name in ("att", "cin", "wk", "masks"):
        torch.testing.assert_close(values[name], getattr(module, name)(fields), rtol=0, atol=0)
    shapes_ = {name: tuple(values[name].shape) for name in ("att", "cin", "wk", "masks", "att_out", "wk_out")}
    assert shapes_ == {
        "att": (6, 6, 4),
        "cin": (6, 4),
        "wk": (6, 3, 4),
        "masks": (6, 3),
        "att_out": (6, 24),
        "wk_out": (6, 12),
    }


@pytest.mark.parametrize("world_size", [1, 2])
def test_no_python_exception_text_becomes_a_diagnostic(
    spec: str, world_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape check's last resort quotes the first line of an exception; none may be raised here."""

    def fail(exc: Exception) -> str:
        raise AssertionError(f"the shape check quoted a Python exception: {exc}")

    monkeypatch.setattr(shapes, "_first_line", fail)
    lowered = compile_spec(spec, Options(world_size=world_size))
    assert {n.name for n in lowered.graph.nodes} >= {"total", "score", "fields", "pairs", "fm", "att", "masks"}
