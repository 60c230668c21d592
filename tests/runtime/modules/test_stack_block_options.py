"""The options the published field-stack models need, against their authors' computations.

- self_attention `residual_projection: false`: FuxiCTR's MultiHeadSelfAttention
  when the input is as wide as the output (its residual the input itself);
- mask_block `emb_norm_scope: whole`: TorchEasyRec's MaskNetModule, one
  torch.nn.LayerNorm over the flattened input;
- cin `bias`: compiled into the CIN module's per-map biases.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from compiler.codegen.emit import emit
from compiler.pipeline import compile_spec
from runtime.modules.blocks.field_attention import FieldSelfAttention
from runtime.modules.blocks.mask_block import MaskNet
from runtime.train.worker import load_module

B, N, D = 4, 5, 6


def stack() -> torch.Tensor:
    return torch.randn(B, N, D, generator=torch.Generator().manual_seed(0))


def fuxictr_self_attention(layer, x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """FuxiCTR's MultiHeadSelfAttention (no scaling, no layer norm), its residual the input itself."""
    w_q, w_k, w_v = layer.in_proj_weight.chunk(3)

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(B, N, heads, head_dim).transpose(1, 2)

    q, k, v = split(x @ w_q.T), split(x @ w_k.T), split(x @ w_v.T)
    attention = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
    output = (attention @ v).transpose(1, 2).reshape(B, N, heads * head_dim)
    return torch.relu(output + x)


def test_an_identity_residual_adds_each_layers_input() -> None:
    torch.manual_seed(0)
    block = FieldSelfAttention(N, D, head_dim=3, num_heads=2, num_layers=2, residual_projection=False)
    assert not [name for name, _ in block.named_parameters() if "residual" in name]
    x = stack()
    expected = x
    for layer in block.interacting:
        expected = fuxictr_self_attention(layer, expected, 2, 3)
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=0)
    message = "FieldSelfAttention: an identity residual needs dim 6 equal to num_heads * head_dim 8"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FieldSelfAttention(N, D, head_dim=4, num_heads=2, residual_projection=False)


@pytest.mark.parametrize("mode", ["parallel", "serial"])
def test_a_whole_input_layer_norm_is_torcheasyrecs(mode: str) -> None:
    torch.manual_seed(0)
    block = MaskNet(N, D, mode, [8, 8], emb_norm_scope="whole")
    with torch.no_grad():
        block.emb_norm_weight.uniform_(0.5, 1.5)
        block.emb_norm_bias.uniform_(-0.5, 0.5)
    ln_emb = nn.LayerNorm(N * D)
    ln_emb.load_state_dict({"weight": block.emb_norm_weight.view(-1), "bias": block.emb_norm_bias.view(-1)})
    x = stack()
    feature_emb = x.reshape(B, -1)
    hidden = ln_emb(feature_emb)
    if mode == "parallel":
        expected = torch.cat([mask_block(feature_emb, hidden) for mask_block in block.blocks], dim=-1)
    else:
        for mask_block in block.blocks:
            hidden = mask_block(feature_emb, hidden)
        expected = hidden
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"^MaskNet: unknown emb_norm_scope 'all' \(expected one of: field, whole\)$"):
        MaskNet(N, D, mode, [8], emb_norm_scope="all")


SPEC = """\
version: 1
name: stack_options
features:
  sparse:
    - {name: cat, count: 5, num_embeddings: 20, dim: 6}
model:
  fields: {type: stack, input: [sparse.*]}
  cin: {type: cin, input: fields, layer_sizes: [4, 4], bias: true}
  attend: {type: self_attention, input: fields, num_heads: 2, attention_dim: 3, num_layers: 1, residual_projection: false}
  flat: {type: flatten, input: attend}
  masks: {type: mask_block, input: fields, mode: parallel, block_sizes: [8], emb_norm_scope: whole}
  top: {type: mlp, input: [cin, flat, masks], layers: [1]}
heads:
  - {name: click, input: top, loss: bce}
"""


def test_the_options_reach_the_built_modules(tmp_path: Path) -> None:
    spec = tmp_path / "stack_options.yaml"
    spec.write_text(SPEC)
    written = emit(compile_spec(str(spec))).write(tmp_path / "build")
    model = load_module(str(written[0])).build()
    assert model.cin.biases is not None and len(model.cin.biases) == 2
    assert model.attend.interacting[0].identity and model.attend.interacting[0].residual is None
    assert model.masks.emb_norm_scope == "whole"
