"""Tests for runtime/modules/blocks/field_attention.py: AutoInt's interacting layers.

The attention core is checked against torch's nn.MultiheadAttention (with the
same projections, no biases and an identity output projection), the whole
layer against the paper's formula written out per head with loops, in
float64 to 1e-10.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from runtime.modules.blocks.field_attention import FieldSelfAttention

F64 = {"rtol": 1e-10, "atol": 1e-10}


def _stack(b: int, n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _mha_core(layer: nn.Module, x: torch.Tensor, scaled: bool) -> torch.Tensor:
    """concat_h softmax(Q K^T) V by nn.MultiheadAttention, which divides by sqrt(d') itself."""
    width = layer.num_heads * layer.head_dim
    mha = nn.MultiheadAttention(width, layer.num_heads, bias=False, batch_first=True).double()
    with torch.no_grad():
        weight = layer.in_proj_weight.detach().clone()
        if not scaled:
            weight[:width] *= math.sqrt(layer.head_dim)  # cancels torch's 1/sqrt(d')
        mha.in_proj_weight.copy_(weight)
        mha.out_proj.weight.copy_(torch.eye(width, dtype=torch.float64))
    out, _ = mha(x, x, x, need_weights=False)
    return out


def _formula(layer: nn.Module, x: torch.Tensor, scaled: bool) -> torch.Tensor:
    """The paper's layer per sample, field and head, with loops."""
    heads, d = layer.num_heads, layer.head_dim
    w = layer.in_proj_weight.detach()
    wq, wk, wv = w[: heads * d], w[heads * d : 2 * heads * d], w[2 * heads * d :]
    out = torch.zeros(x.shape[0], x.shape[1], heads * d, dtype=x.dtype)
    for b in range(x.shape[0]):
        e = x[b]
        for h in range(heads):
            rows = slice(h * d, (h + 1) * d)
            q, k, v = e @ wq[rows].T, e @ wk[rows].T, e @ wv[rows].T
            scores = q @ k.T / (math.sqrt(d) if scaled else 1.0)
            out[b, :, rows] = torch.softmax(scores, dim=1) @ v
        if layer.residual is not None:
            out[b] += e @ layer.residual.weight.detach().T
    return torch.relu(out)


@pytest.mark.parametrize("scaled", [False, True])
def test_attention_core_matches_nn_multihead_attention(scaled: bool) -> None:
    torch.manual_seed(0)
    block = FieldSelfAttention(6, 8, head_dim=4, num_heads=2, num_layers=1, residual=False, scale=scaled).double()
    x = _stack(5, 6, 8)
    expected = torch.relu(_mha_core(block.interacting[0], x, scaled))
    torch.testing.assert_close(block(x), expected, **F64)


def test_residual_layer_matches_the_paper_formula_with_other_widths() -> None:
    torch.manual_seed(1)
    block = FieldSelfAttention(5, 12, head_dim=3, num_heads=2, num_layers=1).double()
    x = _stack(4, 5, 12, seed=1)
    out = block(x)
    assert out.shape == (4, 5, 6) and block.out_dim == 6
    torch.testing.assert_close(out, _formula(block.interacting[0], x, scaled=False), **F64)


def test_stacked_layers_with_layer_norm_apply_each_in_turn() -> None:
    torch.manual_seed(2)
    block = FieldSelfAttention(4, 6, head_dim=4, num_heads=3, num_layers=3, scale=True, layer_norm=True).double()
    x = _stack(3, 4, 6, seed=2)
    expected = x
    for layer in block.interacting:
        expected = nn.functional.layer_norm(
            _formula(layer, expected, scaled=True), (12,), layer.norm.weight, layer.norm.bias
        )
    torch.testing.assert_close(block(x), expected, **F64)


def test_gradcheck() -> None:
    torch.manual_seed(3)
    block = FieldSelfAttention(3, 4, head_dim=2, num_heads=2, num_layers=2).double()
    x = _stack(2, 3, 4, seed=3).requires_grad_()
    torch.autograd.gradcheck(block, (x,))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_fields": 0, "dim": 4}, "FieldSelfAttention: num_fields must be an integer >= 1 (got 0)"),
        ({"num_fields": 3, "dim": 4, "num_heads": 0}, "FieldSelfAttention: num_heads must be an integer >= 1 (got 0)"),
        (
            {"num_fields": 3, "dim": 4, "head_dim": 2.0},
            "FieldSelfAttention: head_dim must be an integer >= 1 (got 2.0)",
        ),
        ({"num_fields": 3, "dim": 4, "residual": 1}, "FieldSelfAttention: residual must be true or false (got 1)"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        FieldSelfAttention(**kwargs)
    assert str(err.value) == message


def test_rejects_a_stack_of_another_shape() -> None:
    block = FieldSelfAttention(3, 4, where="specs/a.yaml:7:5")
    with pytest.raises(ValueError) as err:
        block(torch.zeros(2, 4, 4))
    assert str(err.value) == (
        "FieldSelfAttention (specs/a.yaml:7:5): expected a field stack of shape (B, 3, 4), got (2, 4, 4)"
    )
