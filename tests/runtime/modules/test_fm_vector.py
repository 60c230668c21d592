"""FactorizationMachine(vector=True) against TorchEasyRec's FactorizationMachine, and a spec that feeds it to an MLP."""

from __future__ import annotations

from pathlib import Path

import torch

from compiler.pipeline import compile_spec
from runtime.modules.blocks.pooled import FactorizationMachine


def torcheasyrec_fm(feature: torch.Tensor) -> torch.Tensor:
    """tzrec/modules/fm.py: [B, N, D] -> [B, D]."""
    sum_of_input = torch.sum(feature, dim=1)
    sum_of_square = torch.sum(feature * feature, dim=1)
    return 0.5 * (sum_of_input * sum_of_input - sum_of_square)


def test_the_vector_is_torcheasyrecs_and_sums_to_the_scalar_term() -> None:
    x = torch.randn(5, 4 * 3, generator=torch.Generator().manual_seed(0))
    vector = FactorizationMachine(4, 3, vector=True)
    assert vector.out_features == 3
    out = vector(x)
    torch.testing.assert_close(out, torcheasyrec_fm(x.view(5, 4, 3)), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.sum(dim=1, keepdim=True), FactorizationMachine(4, 3)(x), atol=1e-5, rtol=0)


SPEC = """\
version: 1
name: fm_vector
features:
  sparse:
    - {name: cat, count: 4, num_embeddings: 20, dim: 6}
model:
  fm: {type: fm, input: sparse.*, output: vector}
  top: {type: mlp, input: fm, layers: [8, 1]}
heads:
  - {name: click, input: top, loss: bce}
"""


def test_a_vector_fm_is_as_wide_as_its_inputs_in_the_ir(tmp_path: Path) -> None:
    spec = tmp_path / "fm_vector.yaml"
    spec.write_text(SPEC)
    ir = compile_spec(str(spec)).ir
    fm = next(block for block in ir.blocks if block.name == "fm")
    top = next(block for block in ir.blocks if block.name == "top")
    assert fm.op.output == "vector" and fm.width == 6 and top.inputs[0].width == 6
