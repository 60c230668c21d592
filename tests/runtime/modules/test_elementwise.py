"""Tests for runtime/modules/blocks/elementwise.py and field_stack.py: Product, Activation, Flatten."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.modules.blocks.elementwise import Activation, Product
from runtime.modules.blocks.field_stack import Flatten


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_product_is_elementwise_and_differentiable() -> None:
    a, b, c = (_randn(3, 4, seed=s).requires_grad_() for s in range(3))
    out = Product()(a, b, c)
    expected = [[a[i, j].item() * b[i, j].item() * c[i, j].item() for j in range(4)] for i in range(3)]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    out.sum().backward()
    torch.testing.assert_close(a.grad, (b * c).detach(), rtol=1e-12, atol=1e-12)


def test_product_of_one_input_is_the_input() -> None:
    x = _randn(2, 3, 4)
    assert Product()(x) is x


def test_product_rejects_other_shapes() -> None:
    with pytest.raises(ValueError) as err:
        Product(where="specs/e.yaml:9:3")(torch.zeros(2, 3), torch.zeros(2, 1))
    assert str(err.value) == "Product (specs/e.yaml:9:3): inputs must have the same shape, got [(2, 3), (2, 1)]"


@pytest.mark.parametrize(
    ("name", "formula"),
    [
        ("relu", lambda v: max(v, 0.0)),
        ("sigmoid", lambda v: 1.0 / (1.0 + math.exp(-v))),
        ("tanh", math.tanh),
        ("gelu", lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))),
        ("silu", lambda v: v / (1.0 + math.exp(-v))),
    ],
)
def test_activation_matches_formula_and_leaves_its_input(name: str, formula) -> None:
    x = _randn(3, 2, 4)
    before = x.clone()
    out = Activation(name)(x)
    expected = torch.tensor([formula(v) for v in x.reshape(-1).tolist()], dtype=torch.float64).view(3, 2, 4)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(x, before)


def test_activation_rejects_unknown_names() -> None:
    with pytest.raises(ValueError) as err:
        Activation("none")
    assert str(err.value) == "Activation: unknown activation 'none' (expected one of: gelu, relu, sigmoid, silu, tanh)"


def test_flatten_is_field_after_field() -> None:
    x = _randn(2, 3, 4)
    out = Flatten(3, 4)(x)
    assert out.shape == (2, 12)
    torch.testing.assert_close(out[:, 4:8], x[:, 1], rtol=0, atol=0)


def test_flatten_rejects_bad_arguments_and_inputs() -> None:
    with pytest.raises(ValueError) as err:
        Flatten(0, 4)
    assert str(err.value) == "Flatten: num_fields must be an integer >= 1 (got 0)"
    with pytest.raises(ValueError) as err:
        Flatten(3, 4)(torch.zeros(2, 12))
    assert str(err.value) == "Flatten: expected a field stack of shape (B, 3, 4), got (2, 12)"
