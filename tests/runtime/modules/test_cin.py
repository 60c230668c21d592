"""Tests for runtime/modules/blocks/cin.py: xDeepFM's CIN against its formula, with loops, in float64 to 1e-10."""

from __future__ import annotations

import pytest
import torch

from runtime.modules.blocks.cin import CIN

F64 = {"rtol": 1e-10, "atol": 1e-10}


def _stack(b: int, n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _formula(block: CIN, x: torch.Tensor, act=lambda t: t) -> torch.Tensor:
    """X^k_h = act(sum_{j,i} W^k[h, j*H + i] X^0_j * X^{k-1}_i + b^k_h), sum-pooled per map, per sample."""
    rows = []
    for b in range(x.shape[0]):
        x0, hidden, pooled = x[b], x[b], []
        for k, weight in enumerate(block.weights):
            w = weight.detach()
            maps = []
            for h in range(w.shape[0]):
                total = torch.zeros(x.shape[2], dtype=x.dtype)
                for j in range(x0.shape[0]):
                    for i in range(hidden.shape[0]):
                        total += w[h, j * hidden.shape[0] + i] * x0[j] * hidden[i]
                if block.biases is not None:
                    total += block.biases[k].detach()[h]
                maps.append(act(total))
            maps_t = torch.stack(maps)
            if block.split_half and k < len(block.weights) - 1:
                half = maps_t.shape[0] // 2
                hidden, direct = maps_t[:half], maps_t[half:]
            else:
                hidden = direct = maps_t
            pooled.append(direct.sum(dim=1))
        rows.append(torch.cat(pooled))
    return torch.stack(rows)


@pytest.mark.parametrize(("split_half", "width"), [(True, 2 + 3 + 5), (False, 4 + 6 + 5)])
def test_matches_formula_and_output_width(split_half: bool, width: int) -> None:
    torch.manual_seed(0)
    block = CIN(4, 3, [4, 6, 5], split_half=split_half).double()
    x = _stack(3, 4, 3)
    out = block(x)
    assert block.out_features == width and out.shape == (3, width)
    torch.testing.assert_close(out, _formula(block, x), **F64)


def test_bias_and_activation() -> None:
    torch.manual_seed(1)
    block = CIN(3, 5, [2, 3], activation="tanh", bias=True).double()
    with torch.no_grad():
        for bias in block.biases:
            bias.normal_()
    x = _stack(2, 3, 5, seed=1)
    torch.testing.assert_close(block(x), _formula(block, x, torch.tanh), **F64)


def test_gradcheck() -> None:
    torch.manual_seed(2)
    block = CIN(3, 2, [2, 2], activation="relu", bias=True).double()
    x = _stack(2, 3, 2, seed=2).requires_grad_()
    torch.autograd.gradcheck(block, (x,))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_fields": 3, "dim": 4, "layer_sizes": []}, "CIN: layer_sizes must be a non-empty list of sizes (got [])"),
        (
            {"num_fields": 3, "dim": 4, "layer_sizes": [3, 4]},
            "CIN: layer_sizes[0] must be even with split_half (got 3)",
        ),
        ({"num_fields": 3, "dim": 0, "layer_sizes": [4]}, "CIN: dim must be an integer >= 1 (got 0)"),
        (
            {"num_fields": 3, "dim": 4, "layer_sizes": [4], "activation": "elu"},
            "CIN: unknown activation 'elu' (expected one of: gelu, none, relu, sigmoid, silu, tanh)",
        ),
        ({"num_fields": 3, "dim": 4, "layer_sizes": [4], "bias": "no"}, "CIN: bias must be true or false (got 'no')"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        CIN(**kwargs)
    assert str(err.value) == message


def test_odd_last_layer_is_allowed_with_split_half() -> None:
    assert CIN(3, 4, [4, 3]).out_features == 5
