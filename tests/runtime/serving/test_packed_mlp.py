"""Tests for runtime/serving/packed_mlp.py: packed layers against the MLP's own oneDNN and MKL paths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime.cpu import choice
from runtime.modules.blocks import MLP
from runtime.serving.packed_mlp import PackedMLP, pack_mlps

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def mlp(seed: int = 0, **options: object) -> MLP:
    torch.manual_seed(seed)
    return MLP(37, [96, 40, 1], final_activation="none", **options).eval()


def test_packed_layers_give_the_bits_of_the_onednn_path_at_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = mlp()
    packed = PackedMLP.from_mlp(mlp())
    for batch in (700, 512, 64):  # packed once, at the first batch, then read at others
        x = torch.randn(batch, 37)
        with torch.inference_mode():
            monkeypatch.setenv(choice.ENV, "linear=onednn")
            mine = packed(x)
            theirs = reference(x)
            monkeypatch.setenv(choice.ENV, "linear=aten")
            mkl = reference(x)
        assert torch.equal(mine, theirs), batch
        torch.testing.assert_close(mine, mkl, rtol=1e-5, atol=1e-5)  # another summation order only
    assert set(packed._packs) == {0, 1}  # the 40 x 1 layer is below MIN_ONEDNN_MACS: MKL, as `linear` runs it


def test_layers_linear_runs_on_mkl_small_products_autograd_and_bad_widths_take_the_mlps_own_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference, packed = mlp(), PackedMLP.from_mlp(mlp())
    monkeypatch.setenv(choice.ENV, "linear=aten")
    x = torch.randn(600, 37)
    with torch.inference_mode():
        assert torch.equal(packed(x), reference(x))
    monkeypatch.setenv(choice.ENV, "linear=onednn")  # below MIN_ONEDNN_MACS `linear` stays on MKL
    x = torch.randn(3, 37)
    with torch.inference_mode():
        assert torch.equal(packed(x), reference(x))
    x = torch.randn(600, 37, requires_grad=True)
    assert torch.equal(packed(x), reference(x))
    assert packed._packs == {}
    with pytest.raises(ValueError) as bad, torch.inference_mode():
        packed(torch.randn(600, 36))
    with pytest.raises(ValueError) as expected:
        reference(torch.randn(600, 36))
    assert str(bad.value) == str(expected.value)


def test_new_weights_are_packed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "linear=onednn")
    packed, other = PackedMLP.from_mlp(mlp(seed=0)), mlp(seed=1)
    x = torch.randn(512, 37)
    with torch.inference_mode():
        before = packed(x)
        packed.load_state_dict(other.state_dict())
        after = packed(x)
        expected = other(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, expected)


def test_pack_mlps_swaps_plain_mlps_anywhere_and_keeps_the_state_dict() -> None:
    model = nn.Module()
    model.top = mlp()
    model.towers = nn.ModuleList([mlp(seed=2), mlp(seed=3, norm="layer")])
    keys, weight = list(model.state_dict()), model.top.linears[0].weight
    assert pack_mlps(model) == 2
    assert type(model.top) is PackedMLP and type(model.towers[0]) is PackedMLP
    assert type(model.towers[1]) is MLP  # a norm between the layers: left as it is
    assert list(model.state_dict()) == keys
    assert model.top.linears[0].weight is weight  # the same parameters, not copies
