"""Tests for the int8 way of runtime/serving/packed_mlp.py: int8 layers against the float64 block, within
the error their quantization allows, and the 'mlp_int8' choice that takes them only where asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime.cpu import choice
from runtime.modules.blocks.pooled import MLP
from runtime.serving.packed_mlp import PackedMLP, int8_available, pack_mlps, reduce_range

pytestmark = pytest.mark.skipif(not int8_available(), reason="torch built without a quantized engine")


def top_mlp(seed: int = 0) -> MLP:
    """dlrm-bench's top MLP (415 -> 512 -> 256 -> 1, ReLU but after the last)."""
    torch.manual_seed(seed)
    return MLP(415, [512, 256, 1], final_activation="none").eval()


def quantization_sigma(mlp: MLP, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact block's output on `x` (float64), and the standard deviation of the int8 block's error.

    Per layer y = W x + b, the int8 path computes W' x' + b: W' rounds each row of W to a step
    s_j = max|W_j| / 127, and x' rounds the layer's input to a step s_x = (max(x, 0) - min(x, 0)) /
    levels over the whole tensor (255 levels, 127 with reduce_range). Rounding errors are uniform
    within half a step (variance step^2 / 12) and independent, so the output's error has variance
    sum_i x_i^2 s_j^2 / 12 + W_ji^2 (s_x^2 / 12 + v_i), v the input's own error variance from the
    layers before; ReLU passes it where the output is positive. The worst case (every rounding the
    same sign) is ~50x the output here, so the test holds the errors to this model instead.
    """
    levels = 127 if reduce_range() else 255
    x = x.double()
    variance = torch.zeros_like(x)
    for layer, act in zip(mlp.linears, mlp._activations, strict=True):
        weight, bias = layer.weight.detach().double(), layer.bias.detach().double()
        step = (x.clamp_min(0).amax() - x.clamp_max(0).amin()) / levels
        row_step = weight.abs().amax(dim=1) / 127
        variance = (variance + step**2 / 12) @ (weight**2).T + (x**2).sum(dim=1, keepdim=True) * row_step**2 / 12
        x = x @ weight.T + bias
        if act is not None:
            variance = variance * (x > 0)
            x = torch.relu(x)
    return x, variance.sqrt()


@pytest.mark.parametrize("batch", [4, 64, 512])
def test_int8_layers_err_as_their_quantization_predicts(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "mlp_int8=int8")
    block, exact_block = PackedMLP.from_mlp(top_mlp(), exact=False, int8=True), top_mlp().double()
    x = torch.randn(batch, 415)
    with torch.inference_mode():
        mine = block(x)
        exact, sigma = quantization_sigma(exact_block, x)
    error = mine.double() - exact
    assert bool((error.abs() <= 6 * sigma + 1e-5 * exact.abs()).all()), float((error.abs() / sigma).max())
    # The model predicts the errors' size, not only a ceiling: their RMS within 0.5-2x its figure
    # (the float32 block's errors, ~1e-7, would fail the floor).
    ratio = float(error.square().mean().sqrt() / sigma.square().mean().sqrt())
    assert 0.5 <= ratio <= 2.0, ratio


def test_the_choice_records_float_and_int8_and_forcing_float_gives_the_float_blocks_bits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(choice.ENV, "packed_mlp=aten")
    x = torch.randn(64, 415)
    blocks = [PackedMLP.from_mlp(top_mlp(), exact=False, int8=int8) for int8 in (True, False, True)]
    with torch.inference_mode():
        chosen = blocks[0](x)
        float_block = blocks[1](x)
        monkeypatch.setenv(choice.ENV, "packed_mlp=aten,mlp_int8=float")
        forced = blocks[2](x)
    threads = torch.get_num_threads()
    record = json.loads(
        (choice.directory(tmp_path) / "mlp_int8" / f"b64_in415_512r_256r_1_t{threads}.json").read_text()
    )
    assert sorted(record["times_ms"]) == ["float", "int8"]
    assert record["winner"] == min(record["times_ms"], key=record["times_ms"].get) or record["winner"] == "float"
    assert torch.equal(forced, float_block)
    if record["winner"] == "float":
        assert torch.equal(chosen, float_block)
    else:
        assert not torch.equal(chosen, float_block)


def test_only_blocks_asked_in_int8_ask_the_int8_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(choice.ENV, "packed_mlp=aten")
    block = PackedMLP.from_mlp(top_mlp(), exact=False)
    with torch.inference_mode():
        block(torch.randn(64, 415))
    assert not (choice.directory(tmp_path) / "mlp_int8").exists()
    model = torch.nn.Module()
    model.top = top_mlp()
    assert pack_mlps(model, exact=False, int8=True) == 1 and model.top.int8
    with pytest.raises(ValueError) as refused:
        PackedMLP.from_mlp(top_mlp(), exact=True, int8=True)
    assert str(refused.value) == "PackedMLP: an int8 block is not exact"


def test_new_weights_are_quantized_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "mlp_int8=int8")
    block, other = PackedMLP.from_mlp(top_mlp(seed=0), exact=False, int8=True), top_mlp(seed=1)
    fresh = PackedMLP.from_mlp(top_mlp(seed=1), exact=False, int8=True)
    x = torch.randn(64, 415)
    with torch.no_grad():
        block(x)
        block.load_state_dict(other.state_dict())
        after = block(x)
        expected = fresh(x)
    assert torch.equal(after, expected)
