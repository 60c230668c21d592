"""Tests for runtime/modules/blocks/transformer.py, against torch.nn.TransformerEncoderLayer.

The same weights are loaded into a stack of torch's layers (dropout 0), which
run on the same padded input with `src_key_padding_mask` (and a causal
`mask`); outputs at the real positions and all parameter gradients agree to
1e-5.
"""

from __future__ import annotations

import re

import pytest
import torch
from sequence_inputs import padded_batch
from torch import nn

from runtime.modules.blocks.transformer import Transformer

DIM, HEADS, FFN, LAYERS = 8, 2, 16, 2
TOL = dict(atol=1e-5, rtol=0)


def torch_stack(block: Transformer, activation: str) -> nn.ModuleList:
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(
            DIM,
            HEADS,
            FFN,
            dropout=0.0,
            activation=activation,
            batch_first=True,
            norm_first=block.norm_first,
        )
        for _ in range(block.num_layers)
    )
    for theirs, ours in zip(layers, block.layers):
        theirs.load_state_dict(ours.state_dict())
    return layers


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_equals_torch_encoder_layers_with_the_same_weights(norm_first: bool, causal: bool, activation: str) -> None:
    torch.manual_seed(0)
    block = Transformer(DIM, HEADS, FFN, LAYERS, norm_first, causal, max_length=6, activation=activation)
    reference = torch_stack(block, activation)
    x, lengths = padded_batch(DIM, lengths=[3, 6, 1, 5])
    real = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)

    out = block(x, lengths)
    expected = x + block.positions
    mask = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.bool) if causal else None
    for layer in reference:
        expected = layer(expected, src_mask=mask, src_key_padding_mask=~real, is_causal=causal)
    torch.testing.assert_close(out[real], expected[real], **TOL)
    assert out[~real].abs().sum() == 0

    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out[real] * weights[real]).sum().backward()
    (expected[real] * weights[real]).sum().backward()
    theirs = dict(reference.named_parameters())
    for name, param in block.layers.named_parameters():
        torch.testing.assert_close(param.grad, theirs[name].grad, **TOL, msg=name)


def test_padding_does_not_change_real_outputs_and_empty_is_zero() -> None:
    torch.manual_seed(0)
    block = Transformer(DIM, HEADS, FFN, max_length=6)
    x, lengths = padded_batch(DIM)
    noisy = x.clone()
    noisy[torch.arange(6).unsqueeze(0) >= lengths.unsqueeze(1)] = 100.0
    x.requires_grad_()
    out = block(x, lengths)
    torch.testing.assert_close(out, block(noisy, lengths), **TOL)
    assert out[1].abs().sum() == 0
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def one_position(sequence: torch.Tensor, lengths: torch.Tensor, output: str) -> torch.Tensor:
    """The full output's first or last real position per sample, zeros for an empty sample."""
    position = (lengths - 1).clamp(min=0) if output == "last" else torch.zeros_like(lengths)
    picked = sequence[torch.arange(len(lengths)), position]
    return picked * (lengths > 0).unsqueeze(1).to(picked.dtype)


@pytest.mark.parametrize("output", ["first", "last"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_one_position_output_equals_that_position_of_the_full_output(
    output: str, norm_first: bool, causal: bool, num_layers: int
) -> None:
    torch.manual_seed(0)
    full = Transformer(DIM, HEADS, FFN, num_layers, norm_first, causal, max_length=6)
    block = Transformer(DIM, HEADS, FFN, num_layers, norm_first, causal, max_length=6, output=output)
    block.load_state_dict(full.state_dict())
    x, lengths = padded_batch(DIM)
    x_full, x_one = x.clone().requires_grad_(), x.clone().requires_grad_()

    expected = one_position(full(x_full, lengths), lengths, output)
    out = block(x_one, lengths)
    torch.testing.assert_close(out, expected, **TOL)
    assert out[1].abs().sum() == 0  # the empty sample

    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (expected * weights).sum().backward()
    (out * weights).sum().backward()
    torch.testing.assert_close(x_one.grad, x_full.grad, **TOL)
    theirs = dict(full.named_parameters())
    for name, param in block.named_parameters():
        torch.testing.assert_close(param.grad, theirs[name].grad, **TOL, msg=name)


def test_one_position_output_of_empty_sequences_is_zero() -> None:
    block = Transformer(DIM, HEADS, FFN, max_length=6, output="first")
    x, lengths = padded_batch(DIM, lengths=[0, 0])
    assert torch.equal(block(x, lengths), torch.zeros(2, DIM))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Transformer(6, 4, 8), "Transformer: dim 6 is not divisible by num_heads 4"),
        (
            lambda: Transformer(8, 2, 8, activation="tanh"),
            "Transformer: unknown activation 'tanh' (expected one of: relu, gelu, leaky_relu)",
        ),
        (
            lambda: Transformer(8, 2, 8, output="mean"),
            "Transformer: unknown output 'mean' (expected one of: sequence, first, last)",
        ),
        (lambda: Transformer(8, 2, 0), "Transformer: ffn_dim must be an integer >= 1 (got 0)"),
        (lambda: Transformer(8, 2, 8, dropout=1.0), "Transformer: dropout must be a number in [0, 1) (got 1.0)"),
        (
            lambda: Transformer(8, 2, 8, norm_first=True, sasrec=True),
            "Transformer: sasrec is its own arrangement of the norms; norm_first must be False",
        ),
        (lambda: Transformer(8, 2, 8, max_length=-1), "Transformer: max_length must be an integer >= 0 (got -1)"),
        (
            lambda: Transformer(8, 2, 8, max_length=4)(*padded_batch(8)),
            "Transformer: a padded length of 6 exceeds max_length 4",
        ),
        (
            lambda: Transformer(4, 2, 8)(*padded_batch(8)),
            "Transformer: expected a sequence of shape (B, L, 4), got (5, 6, 8)",
        ),
    ],
)
def test_errors_name_the_block(call, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()
