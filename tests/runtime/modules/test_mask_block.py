"""Tests for runtime/modules/blocks/mask_block.py: MaskBlock and MaskNet against the paper's formulas, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime.modules.blocks.mask_block import MaskBlock, MaskNet

F64 = {"rtol": 1e-10, "atol": 1e-10}


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _affine(linear: nn.Linear, v: torch.Tensor) -> torch.Tensor:
    out = v @ linear.weight.detach().T
    return out + linear.bias.detach() if linear.bias is not None else out


def _block(block: MaskBlock, v_emb: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """ReLU(LN(W_i ((W_2 ReLU(W_1 V_emb + b_1) + b_2) * V)))."""
    mask = _affine(block.projection, torch.relu(_affine(block.aggregation, v_emb)))
    hidden = _affine(block.hidden, mask * v)
    if block.norm is not None:
        hidden = F.layer_norm(hidden, hidden.shape[1:], block.norm.weight, block.norm.bias)
    return torch.relu(hidden)


def _emb_norm(net: MaskNet, x: torch.Tensor) -> torch.Tensor:
    """One nn.LayerNorm per field, with the field's gain and bias."""
    fields = []
    for i in range(x.shape[1]):
        norm = nn.LayerNorm(x.shape[2]).double()
        with torch.no_grad():
            norm.weight.copy_(net.emb_norm_weight[i])
            norm.bias.copy_(net.emb_norm_bias[i])
        fields.append(norm(x[:, i]))
    return torch.cat(fields, dim=1)


def _perturbed(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("layer_norm", [True, False])
def test_mask_block_matches_formula(layer_norm: bool) -> None:
    torch.manual_seed(0)
    block = _perturbed(MaskBlock(12, 6, 5, reduction_ratio=2.0, layer_norm=layer_norm).double())
    assert block.aggregation.out_features == 12
    assert (block.hidden.bias is None) == layer_norm
    v_emb, v = _randn(4, 12), _randn(4, 6, seed=1)
    torch.testing.assert_close(block(v_emb, v), _block(block, v_emb, v), **F64)


def test_serial_masknet_masks_each_output_with_the_raw_embedding() -> None:
    torch.manual_seed(1)
    net = _perturbed(MaskNet(3, 4, "serial", [10, 7], reduction_ratio=1.5).double())
    x = _randn(5, 3, 4, seed=2)
    v_emb = x.reshape(5, 12)
    expected = _emb_norm(net, x)
    for block in net.blocks:
        expected = _block(block, v_emb, expected)
    assert net.out_features == 7
    torch.testing.assert_close(net(x), expected, **F64)


def test_parallel_masknet_concatenates_blocks_then_runs_its_mlp() -> None:
    torch.manual_seed(2)
    net = _perturbed(MaskNet(3, 4, "parallel", [6, 6, 6], layers=[8, 4]).double())
    x = _randn(5, 3, 4, seed=3)
    v_emb, normed = x.reshape(5, 12), _emb_norm(net, x)
    blocks = torch.cat([_block(block, v_emb, normed) for block in net.blocks], dim=1)
    expected = torch.relu(_affine(net.mlp.linears[1], torch.relu(_affine(net.mlp.linears[0], blocks))))
    assert net.out_features == 4
    torch.testing.assert_close(net(x), expected, **F64)


def test_without_emb_layer_norm_the_first_block_masks_the_raw_embedding() -> None:
    torch.manual_seed(3)
    net = MaskNet(2, 3, "parallel", [4], emb_layer_norm=False).double()
    x = _randn(3, 2, 3, seed=4)
    v_emb = x.reshape(3, 6)
    torch.testing.assert_close(net(x), _block(net.blocks[0], v_emb, v_emb), **F64)


def test_gradcheck() -> None:
    torch.manual_seed(4)
    net = MaskNet(2, 3, "serial", [4, 3], activation="tanh").double()
    x = _randn(3, 2, 3, seed=5).requires_grad_()
    torch.autograd.gradcheck(net, (x,))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "stacked"}, "MaskNet: unknown mode 'stacked' (expected one of: parallel, serial)"),
        ({"block_sizes": []}, "MaskNet: block_sizes must be a non-empty list of sizes (got [])"),
        ({"reduction_ratio": 0}, "MaskBlock: reduction_ratio must be a number > 0 (got 0)"),
        (
            {"reduction_ratio": 0.01},
            "MaskBlock: reduction_ratio 0.01 times in_features 6 leaves an aggregation layer of width 0",
        ),
        ({"layers": [4, 0]}, "MaskNet: layers[1] must be an integer >= 1 (got 0)"),
        ({"emb_layer_norm": None}, "MaskNet: emb_layer_norm must be true or false (got None)"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    arguments = {"num_fields": 2, "dim": 3, "mode": "serial", "block_sizes": [4], **kwargs}
    with pytest.raises(ValueError) as err:
        MaskNet(**arguments)
    assert str(err.value) == message


def test_mask_block_rejects_inputs_of_other_widths() -> None:
    block = MaskBlock(6, 4, 2, where="specs/m.yaml:3:3")
    with pytest.raises(ValueError) as err:
        block(torch.zeros(2, 6), torch.zeros(2, 5))
    assert str(err.value) == (
        "MaskBlock (specs/m.yaml:3:3): expected inputs of shapes (B, 6) and (B, 4), got (2, 6) and (2, 5)"
    )
