"""Tests for runtime/serving/packed_mlp.py: packed layers against the MLP's own oneDNN and MKL paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from runtime.cpu import choice
from runtime.modules.blocks.pooled import MLP
from runtime.serving.packed_mlp import PackedMLP, pack_mlps

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def mlp(seed: int = 0, **options: object) -> MLP:
    torch.manual_seed(seed)
    return MLP(37, [96, 40, 1], final_activation="none", **options).eval()


def test_packed_layers_give_the_bits_of_the_onednn_path_at_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = mlp()
    packed = PackedMLP.from_mlp(mlp(), exact=True)
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
    reference, packed = mlp(), PackedMLP.from_mlp(mlp(), exact=True)
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
    packed, other = PackedMLP.from_mlp(mlp(seed=0), exact=True), mlp(seed=1)
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
    assert pack_mlps(model, exact=False) == 2
    assert type(model.top) is PackedMLP and type(model.towers[0]) is PackedMLP
    assert not model.top.exact and not model.towers[0].exact
    assert type(model.towers[1]) is MLP  # a norm between the layers: left as it is
    assert list(model.state_dict()) == keys
    assert model.top.linears[0].weight is weight  # the same parameters, not copies


def test_an_approximate_export_runs_the_block_the_faster_way_whatever_linear_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reference, packed = mlp(), PackedMLP.from_mlp(mlp(), exact=False)
    exact = PackedMLP.from_mlp(mlp(), exact=True)
    x = torch.randn(1024, 37)
    monkeypatch.setenv(choice.ENV, "linear=aten,packed_mlp=packed")
    with torch.inference_mode():
        mine = packed(x)
        monkeypatch.setenv(choice.ENV, "linear=onednn")
        onednn = exact(x)
        monkeypatch.setenv(choice.ENV, "linear=aten")
        mkl = reference(x)
        monkeypatch.setenv(choice.ENV, "linear=onednn,packed_mlp=aten")
        plain = PackedMLP.from_mlp(mlp(), exact=False)(x)
    assert torch.equal(mine, onednn)  # packed although `linear` chose MKL
    torch.testing.assert_close(mine, mkl, rtol=1e-5, atol=1e-5)
    assert torch.equal(plain, mkl)  # MKL although `linear` chose oneDNN
    assert set(packed._packs) == {0, 1}  # the 40 x 1 layer is below MIN_ONEDNN_MACS: MKL, unmeasured


def test_an_approximate_exports_block_is_measured_once_per_batch_bucket_and_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice.ENV, raising=False)
    packed, x = PackedMLP.from_mlp(mlp(), exact=False), torch.randn(1024, 37)
    with torch.inference_mode():
        out = packed(x)
        expected = mlp()(x)
        packed(torch.randn(1000, 37))  # the same batch bucket: decided already
        packed(torch.randn(3, 37))  # too small for oneDNN at every layer: MKL, nothing to ask
    threads = torch.get_num_threads()
    folder = choice.directory(tmp_path) / "packed_mlp"
    assert sorted(path.name for path in folder.iterdir()) == [f"b1024_in37_96r_40r_1_t{threads}.json"]
    record = json.loads((folder / f"b1024_in37_96r_40r_1_t{threads}.json").read_text())
    assert record["winner"] in ("aten", "packed") and sorted(record["times_ms"]) == ["aten", "packed"]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_the_layers_read_once_follow_new_parameters_new_storage_and_copies() -> None:
    """A forward reads each layer's weight, bias and `weight.t()` from a table built once: a parameter
    replaced, given new storage or written to in place must be seen at the next call."""
    packed, x = PackedMLP.from_mlp(mlp(seed=0), exact=False), torch.randn(3, 37)  # MKL at every layer
    expected = [mlp(seed=seed) for seed in (1, 2, 3)]
    with torch.inference_mode():
        first = packed(x)
        assert torch.equal(first, mlp(seed=0)(x))
    with torch.no_grad():
        packed.linears[0].weight.copy_(expected[0].linears[0].weight)  # in place
        packed.linears[0].bias.copy_(expected[0].linears[0].bias)
    with torch.inference_mode():
        partly = packed(x)
    reference = mlp(seed=0)
    reference.linears[0].load_state_dict(expected[0].linears[0].state_dict())
    assert torch.equal(partly, reference(x))
    packed.load_state_dict(expected[1].state_dict())
    for layer, other in zip(packed.linears, expected[2].linears, strict=True):
        layer.weight = nn.Parameter(other.weight.detach().clone())  # another parameter
        layer.bias.data = other.bias.detach().clone()  # new storage under the same parameter
    with torch.inference_mode():
        assert torch.equal(packed(x), expected[2](x))
    for layer, other in zip(packed.linears, expected[1].linears, strict=True):
        layer.weight.data = other.weight.detach().clone()  # new storage for the weight itself
    reference = mlp(seed=3)
    for layer, other in zip(reference.linears, expected[1].linears, strict=True):
        layer.weight.data = other.weight.detach().clone()
    with torch.inference_mode():
        assert torch.equal(packed(x), reference(x))


def test_the_layers_onednn_applies_to_follow_the_exact_batch_within_a_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which layers run packed is read from a table built per (batch, threads), not per batch bucket:
    at 600 rows both 37 x 96 and 96 x 40 reach MIN_ONEDNN_MACS, at 560 (the same bucket, 1024) only
    96 x 40 does, as `onednn_applies` says at each; the tables kept are bounded."""
    from runtime.serving import packed_mlp

    monkeypatch.setenv(choice.ENV, "packed_mlp=packed")
    packed, reference = PackedMLP.from_mlp(mlp(), exact=False), mlp()
    runs: list[int] = []
    pack = PackedMLP._packed
    monkeypatch.setattr(PackedMLP, "_packed", lambda self, k, *args: runs.append(k) or pack(self, k, *args))
    with torch.inference_mode():
        for batch, expected in ((600, [0, 1]), (560, [1]), (600, [0, 1])):
            runs.clear()
            x = torch.randn(batch, 37)
            torch.testing.assert_close(packed(x), reference(x), rtol=1e-5, atol=1e-5)
            assert runs == expected, batch
        for batch in range(1, packed_mlp.QUESTIONS_KEPT + 10):
            packed(torch.randn(batch, 37))
    assert 0 < len(packed._questions) <= packed_mlp.QUESTIONS_KEPT
