"""Tests for runtime/modules/layers/linear.py: the oneDNN path against F.linear in float64.

The reference runs in float64 on the same float32 inputs, so the tolerance
only has to cover float32 rounding of the oneDNN GEMMs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.cpu import choice
from runtime.modules.layers import linear as linear_module
from runtime.modules.layers.linear import Linear, linear, onednn_applies

F32 = {"rtol": 1e-5, "atol": 1e-5}

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture(autouse=True)
def onednn_for_any_size(monkeypatch, request, tmp_path) -> None:
    """The small shapes here would take F.linear; the numerics tests want the oneDNN path. What is
    measured (the weight gradient's form) is kept in a cache of the test's own."""
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    if "small_products" not in request.node.name:
        monkeypatch.setattr(linear_module, "MIN_ONEDNN_MACS", 1)
        monkeypatch.setenv(choice.ENV, "linear=onednn")


def _leaf(*shape: int, seed: int, requires_grad: bool = True) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).requires_grad_(requires_grad)


def _grads_of(out: torch.Tensor, grad: torch.Tensor, leaves: list[torch.Tensor]) -> list[torch.Tensor | None]:
    out.backward(grad)
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("in_features", [37, 40])  # mm's weight gradient takes one form for each
@pytest.mark.parametrize("weight_grad", ["mm", "onednn"])  # kernel 'linear_grad_weight'
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("batch", [1, 7, 300])
def test_forward_and_gradients_match_float64_reference(
    relu: bool, bias: bool, batch: int, weight_grad: str, in_features: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(choice.ENV, f"linear=onednn,linear_grad_weight={weight_grad}")
    x, w = _leaf(batch, in_features, seed=1), _leaf(19, in_features, seed=2)
    b = _leaf(19, seed=3) if bias else None
    grad = torch.randn(batch, 19, generator=torch.Generator().manual_seed(4))
    leaves = [t for t in (x, w, b) if t is not None]
    assert onednn_applies(x, w)

    out = linear(x, w, b, relu=relu)
    got = _grads_of(out, grad, leaves)

    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    x64, w64 = ref_leaves[0], ref_leaves[1]
    ref = F.linear(x64, w64, ref_leaves[2] if bias else None)
    ref = torch.relu(ref) if relu else ref
    expected = _grads_of(ref, grad.double(), ref_leaves)

    torch.testing.assert_close(out.double(), ref.detach(), **F32)
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine.double(), theirs, **F32)


def test_only_the_needed_gradients_are_computed() -> None:
    x = _leaf(16, 8, seed=1, requires_grad=False)  # a data input: no gradient wanted
    w, b = _leaf(4, 8, seed=2), _leaf(4, seed=3, requires_grad=False)
    linear(x, w, b, relu=True).sum().backward()
    assert x.grad is None and b.grad is None
    expected = (torch.relu(F.linear(x, w, b)) > 0).double().t() @ x.double()
    torch.testing.assert_close(w.grad.double(), expected, **F32)


def test_bias_alone_trainable_still_gets_its_gradient() -> None:
    x, w, b = _leaf(5, 3, seed=1, requires_grad=False), _leaf(2, 3, seed=2, requires_grad=False), _leaf(2, seed=3)
    linear(x, w, b).sum().backward()
    torch.testing.assert_close(b.grad, torch.full((2,), 5.0))


def test_no_grad_forward_and_fallbacks_agree() -> None:
    x, w, b = _leaf(6, 5, seed=1), _leaf(3, 5, seed=2), _leaf(3, seed=3)
    with torch.no_grad():
        fast = linear(x, w, b, relu=True)
        plain = torch.relu(F.linear(x, w, b))
        torch.testing.assert_close(fast, plain, **F32)
        # float64, an empty batch and meta tensors take F.linear
        assert not onednn_applies(x.double(), w.double())
        assert linear(x[:0], w, b).shape == (0, 3)
        assert linear(x.to("meta"), w.to("meta"), b.to("meta"), relu=True).shape == (6, 3)


def test_linear_module_keeps_nn_linear_parameters_and_state() -> None:
    torch.manual_seed(0)
    layer = Linear(5, 3)
    torch.manual_seed(0)
    reference = torch.nn.Linear(5, 3)
    assert layer.state_dict().keys() == reference.state_dict().keys()
    torch.testing.assert_close(layer.weight, reference.weight)
    x = _leaf(4, 5, seed=1)
    torch.testing.assert_close(layer(x), reference(x), **F32)


def test_small_products_take_aten_and_large_ones_onednn() -> None:
    weight = torch.randn(512, 415)
    assert not onednn_applies(torch.randn(1, 415), weight)  # serving one sample: a GEMV
    assert onednn_applies(torch.randn(2048, 415), weight)
    assert not onednn_applies(torch.randn(2048, 256), torch.randn(1, 256))  # the logit layer
    x = torch.randn(3, 415, requires_grad=True)
    out = linear(x, weight.requires_grad_(), None, relu=True)
    assert out.grad_fn.name() == "_PaddedLinearBackward"  # aten's GEMMs (415 columns: padded_grad's layer)
    with torch.no_grad():
        assert torch.equal(linear(x, weight, None, relu=True), torch.relu(x @ weight.t()))
