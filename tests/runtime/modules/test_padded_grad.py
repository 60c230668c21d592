"""Tests for runtime/modules/layers/padded_grad.py: the layer against torch's nn.Linear + ReLU.

Both paths of the input gradient (forced through RECCOMPILE_KERNELS) are
compared with autograd over nn.Linear on the same float32 inputs: values and
every gradient within float32 rounding of a GEMM summed in another order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from runtime.cpu import choice
from runtime.modules.layers import padded_grad
from runtime.modules.layers.linear import linear

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _layer(in_features: int, out_features: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias)


def _input(batch: int, width: int, seed: int, requires_grad: bool = True) -> torch.Tensor:
    return torch.randn(batch, width, generator=torch.Generator().manual_seed(seed)).requires_grad_(requires_grad)


@pytest.mark.parametrize("path", ["plain", "padded"])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("batch", "in_features", "out_features"), [(300, 415, 64), (7, 13, 24), (1, 37, 19)])
def test_values_and_gradients_match_nn_linear(
    monkeypatch: pytest.MonkeyPatch, path: str, relu: bool, bias: bool, batch: int, in_features: int, out_features: int
) -> None:
    monkeypatch.setenv(choice.ENV, f"linear_grad_input={path},linear=aten")
    reference = _layer(in_features, out_features, bias, seed=in_features)
    mine = _layer(in_features, out_features, bias, seed=in_features)
    x, x_ref = _input(batch, in_features, seed=1), _input(batch, in_features, seed=1)
    grad = torch.randn(batch, out_features, generator=torch.Generator().manual_seed(2))
    assert padded_grad.applies(x, mine.weight)

    out = linear(x, mine.weight, mine.bias, relu=relu)
    expected = reference(x_ref)
    expected = torch.relu(expected) if relu else expected
    out.backward(grad)
    expected.backward(grad)

    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # the same addmm
    torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
    torch.testing.assert_close(mine.weight.grad, reference.weight.grad, **TOL)
    assert mine.weight.grad.is_contiguous()
    if bias:
        torch.testing.assert_close(mine.bias.grad, reference.bias.grad, **TOL)


def test_the_padded_input_gradient_is_a_view_of_aligned_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "linear_grad_input=padded")
    weight = torch.randn(512, 415)
    got = padded_grad.input_grad(torch.randn(20, 512), weight)
    assert got.shape == (20, 415) and got.stride() == (416, 1)


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize(("in_features", "out_features"), [(13, 512), (415, 32)])
def test_an_input_layer_takes_the_function_with_the_weights_gradients_of_nn_linear(
    relu: bool, in_features: int, out_features: int
) -> None:
    reference, mine = _layer(in_features, out_features, True, seed=5), _layer(in_features, out_features, True, seed=5)
    x = _input(9, in_features, seed=6, requires_grad=False)  # dense data: no gradient wanted
    assert padded_grad.applies(x, mine.weight)
    out = padded_grad.padded_linear(x, mine.weight, mine.bias, relu)
    expected = torch.relu(reference(x)) if relu else reference(x)
    grad = torch.randn(9, out_features, generator=torch.Generator().manual_seed(3))
    out.backward(grad)
    expected.backward(grad)
    assert out.grad_fn.name() == "_PaddedLinearBackward" and x.grad is None
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # the same addmm
    torch.testing.assert_close(mine.weight.grad, reference.weight.grad, **TOL)
    torch.testing.assert_close(mine.bias.grad, reference.bias.grad, **TOL)


def test_layers_it_does_not_apply_to() -> None:
    frozen = torch.randn(16, 13)
    assert not padded_grad.applies(_input(4, 13, seed=1, requires_grad=False), frozen)  # nothing needs a gradient
    assert not padded_grad.applies(_input(4, 16, seed=1), torch.randn(8, 16, requires_grad=True))  # 16 is aligned
    assert padded_grad.applies(_input(4, 13, seed=1, requires_grad=False), frozen.requires_grad_())


def test_the_function_skips_the_gradients_nobody_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "linear_grad_input=padded")
    reference = _layer(13, 16, True, seed=7)
    weight = reference.weight.detach().requires_grad_()
    x, x_ref = _input(11, 13, seed=8, requires_grad=False), _input(11, 13, seed=8, requires_grad=False)
    out = padded_grad.padded_linear(x, weight, reference.bias.detach(), relu=True)
    out.sum().backward()
    torch.relu(reference(x_ref)).sum().backward()
    assert x.grad is None
    torch.testing.assert_close(weight.grad, reference.weight.grad, **TOL)


@pytest.mark.parametrize("path", ["plain", "padded"])
def test_double_backward_matches_nn_linear(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setenv(choice.ENV, f"linear_grad_input={path},linear=aten")
    reference, mine = _layer(21, 10, True, seed=9), _layer(21, 10, True, seed=9)
    x, x_ref = _input(6, 21, seed=10), _input(6, 21, seed=10)
    (grad_x,) = torch.autograd.grad(linear(x, mine.weight, mine.bias).pow(2).sum(), x, create_graph=True)
    (grad_ref,) = torch.autograd.grad(reference(x_ref).pow(2).sum(), x_ref, create_graph=True)
    grad_x.sum().backward()
    grad_ref.sum().backward()
    torch.testing.assert_close(grad_x, grad_ref, **TOL)
    torch.testing.assert_close(mine.weight.grad, reference.weight.grad, **TOL)


def test_the_first_call_at_a_shape_measures_and_records_the_choice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice.ENV, raising=False)
    padded_grad.input_grad(torch.randn(64, 32), torch.randn(32, 45))
    [recorded] = [c for c in choice.recorded() if c.kernel == "linear_grad_input"]
    assert recorded.shape == f"b64_in45_out32_t{torch.get_num_threads()}"
    assert recorded.winner in ("plain", "padded")
    assert sorted(name for name, _ in recorded.times_ms) == ["padded", "plain"]
