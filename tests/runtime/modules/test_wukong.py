"""Tests for runtime/modules/blocks/wukong.py: each layer against the paper's formula, per sample, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.modules.blocks.wukong import Wukong

F64 = {"rtol": 1e-10, "atol": 1e-10}


def _stack(b: int, n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _mlp(layer, v: torch.Tensor) -> torch.Tensor:
    linears = layer.fmb_mlp.linears
    for k, linear in enumerate(linears):
        v = v @ linear.weight.detach().T + linear.bias.detach()
        if k < len(linears) - 1:
            v = torch.relu(v)
    return v


def _layer_formula(layer, x: torch.Tensor) -> torch.Tensor:
    """LN_d(concat(MLP(LN(flatten(X X^T Y))), W_L X) + R X), one sample at a time."""
    out = []
    for e in x:  # [n, d]
        interactions = (e @ e.T @ layer.fmb_projection.detach()).reshape(-1)  # the rank-k FM: X X^T Y
        normed = F.layer_norm(interactions, interactions.shape, layer.fmb_norm.weight, layer.fmb_norm.bias)
        fmb = _mlp(layer, normed).reshape(layer.num_fmb, -1)
        lcb = layer.lcb_weight.detach() @ e
        shortcut = e if layer.residual_projection is None else layer.residual_projection.detach() @ e
        out.append(F.layer_norm(torch.cat([fmb, lcb]) + shortcut, (e.shape[1],), layer.norm.weight, layer.norm.bias))
    return torch.stack(out)


def test_layers_match_the_formula_with_and_without_residual_projection() -> None:
    torch.manual_seed(0)
    block = Wukong(6, 4, num_layers=3, num_fmb=3, num_lcb=2, rank=3, fmb_layers=[16, 8]).double()
    with torch.no_grad():  # away from LayerNorm's init, so gains and biases are exercised
        for p in block.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = _stack(3, 6, 4)
    assert block.layers[0].residual_projection is not None and block.layers[1].residual_projection is None
    expected = x
    for layer in block.layers:
        expected = _layer_formula(layer, expected)
    out = block(x)
    assert out.shape == (3, 5, 4)
    torch.testing.assert_close(out, expected, **F64)


def test_without_hidden_fmb_layers_the_mlp_is_one_linear() -> None:
    torch.manual_seed(1)
    block = Wukong(3, 2, num_layers=1, num_fmb=2, num_lcb=1, rank=2).double()
    x = _stack(2, 3, 2, seed=1)
    assert len(block.layers[0].fmb_mlp.linears) == 1
    torch.testing.assert_close(block(x), _layer_formula(block.layers[0], x), **F64)


def test_gradcheck() -> None:
    torch.manual_seed(2)
    block = Wukong(3, 2, num_layers=2, num_fmb=2, num_lcb=2, rank=2, fmb_layers=[4]).double()
    x = _stack(2, 3, 2, seed=2).requires_grad_()
    torch.autograd.gradcheck(block, (x,))


def test_mlp_dropout_seeds_differ_per_layer() -> None:
    block = Wukong(3, 2, num_layers=2, num_fmb=2, num_lcb=1, rank=2, fmb_layers=[4], mlp_dropout=0.5, seed=7)
    seeds = [layer.fmb_mlp.dropouts[0].seed for layer in block.layers]
    assert len(set(seeds)) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0}, "Wukong: rank must be an integer >= 1 (got 0)"),
        ({"num_lcb": -1}, "Wukong: num_lcb must be an integer >= 1 (got -1)"),
        ({"fmb_layers": 8}, "Wukong: fmb_layers must be a list of sizes (got 8)"),
        ({"fmb_layers": [8, 0]}, "Wukong: fmb_layers[1] must be an integer >= 1 (got 0)"),
        ({"mlp_dropout": 0.5}, "Wukong: mlp_norm and mlp_dropout need hidden fmb_layers (got [])"),
        (
            {"fmb_layers": [4], "mlp_norm": "group"},
            "Wukong: unknown mlp_norm 'group' (expected one of: batch, layer, none)",
        ),
        ({"fmb_layers": [4], "mlp_dropout": 1.0}, "Wukong: mlp_dropout must be a number in [0, 1) (got 1.0)"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    arguments = {"num_fields": 3, "dim": 2, "num_layers": 1, "num_fmb": 2, "num_lcb": 1, "rank": 2, **kwargs}
    with pytest.raises(ValueError) as err:
        Wukong(**arguments)
    assert str(err.value) == message
