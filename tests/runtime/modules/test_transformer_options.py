"""Tests for the options of runtime/modules/blocks/transformer.py that generative-recommenders' SASRec uses.

References: torch.nn.TransformerEncoderLayer (leaky ReLU, norms without
affine parameters, sqrt(dim) input scaling), generative-recommenders'
SASRec layer written with nn.MultiheadAttention and F.layer_norm
(`x' = LN(LN(x) + MHA(LN(x), x, x)); out = x' + FFN(x')`), and for dropout
the layer's formula with masks drawn by `keep_mask` for the global samples.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from sequence_inputs import padded_batch
from torch import nn

import runtime.modules.layers.sequence_dropout as sequence_dropout
from runtime.modules.blocks.transformer import Transformer
from runtime.modules.layers.dropout import keep_mask

DIM, HEADS, FFN, LAYERS, LENGTH = 8, 2, 16, 2, 6
TOL = dict(atol=1e-5, rtol=0)
LENGTHS = [3, 6, 1, 5]


def real_mask(lengths: torch.Tensor) -> torch.Tensor:
    return torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)


def torch_stack(block: Transformer, activation) -> nn.ModuleList:
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(
            DIM, HEADS, FFN, dropout=0.0, activation=activation, batch_first=True, norm_first=block.norm_first
        )
        for _ in range(block.num_layers)
    )
    for theirs, ours in zip(layers, block.layers):
        theirs.load_state_dict(ours.state_dict(), strict=block.norm_affine)
    return layers


def run_torch(layers: nn.ModuleList, x: torch.Tensor, lengths: torch.Tensor, causal: bool) -> torch.Tensor:
    mask = nn.Transformer.generate_square_subsequent_mask(LENGTH, dtype=torch.bool) if causal else None
    for layer in layers:
        x = layer(x, src_mask=mask, src_key_padding_mask=~real_mask(lengths), is_causal=causal)
    return x


@pytest.mark.parametrize("norm_first", [False, True])
def test_leaky_relu_no_affine_and_scaled_input_equal_torch_layers(norm_first: bool) -> None:
    torch.manual_seed(0)
    block = Transformer(
        DIM,
        HEADS,
        FFN,
        LAYERS,
        norm_first,
        causal=True,
        max_length=LENGTH,
        activation="leaky_relu",
        norm_affine=False,
        scale_input=True,
    )
    assert not [name for name, _ in block.named_parameters() if "norm" in name]
    reference = torch_stack(block, F.leaky_relu)  # its norms keep their initial scale 1 and shift 0
    x, lengths = padded_batch(DIM, lengths=LENGTHS)
    real = real_mask(lengths)
    out = block(x, lengths)
    expected = run_torch(reference, x * DIM**0.5 + block.positions, lengths, causal=True)
    torch.testing.assert_close(out[real], expected[real], **TOL)


def sasrec_reference(block: Transformer, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """generative-recommenders' SASRec._run_one_layer over the padded input, with our layers' weights."""
    causal = torch.triu(torch.ones(LENGTH, LENGTH, dtype=torch.bool), diagonal=1)
    valid = real_mask(lengths).unsqueeze(-1).float()
    x = x * valid
    for layer in block.layers:
        mha = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        mha.load_state_dict(layer.self_attn.state_dict())
        q = F.layer_norm(x, (DIM,), eps=1e-8)
        attended, _ = mha(q, x, x, attn_mask=causal)
        x = F.layer_norm(q + attended, (DIM,), eps=1e-8)
        x = x + layer.linear2(torch.relu(layer.linear1(x)))
        x = x * valid
    return x


def test_sasrec_arrangement_equals_generative_recommenders_layer() -> None:
    torch.manual_seed(0)
    block = Transformer(DIM, HEADS, FFN, LAYERS, causal=True, sasrec=True, norm_affine=False)
    x, lengths = padded_batch(DIM, lengths=LENGTHS)
    real = real_mask(lengths)
    x.requires_grad_()
    out = block(x, lengths)
    expected = sasrec_reference(block, x, lengths)
    torch.testing.assert_close(out[real], expected[real], **TOL)
    assert out[~real].abs().sum() == 0

    last = Transformer(DIM, HEADS, FFN, LAYERS, causal=True, sasrec=True, norm_affine=False, output="last")
    last.load_state_dict(block.state_dict())
    positions = lengths - 1
    torch.testing.assert_close(last(x, lengths), out[torch.arange(len(lengths)), positions], **TOL)


def dropout_reference(block: Transformer, x: torch.Tensor, lengths: torch.Tensor, step: int) -> torch.Tensor:
    """The post-norm layers with dropout, every mask drawn by keep_mask over the padded shapes."""
    p, seed = block.dropout, block.drop.seed
    samples = torch.arange(x.shape[0])

    def drop(t: torch.Tensor, prob: float, stream: int) -> torch.Tensor:
        mask = keep_mask(prob, seed, stream, step, samples, t[0].numel()).view(t.shape)
        return t * mask / (1 - prob)

    real = real_mask(lengths)
    allowed = (real | (torch.arange(LENGTH) == 0)).view(-1, 1, 1, LENGTH)
    x = drop(x + block.positions, block.input_dropout, 0) * real.unsqueeze(-1)
    for i, layer in enumerate(block.layers):
        stream = 1 + 4 * i
        qkv = F.linear(x, layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias)
        q, k, v = qkv.view(x.shape[0], LENGTH, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(2, 3)) / (DIM // HEADS) ** 0.5
        weights = drop(torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1), p, stream)
        attended = (weights @ v).transpose(1, 2).reshape(x.shape)
        attended = drop(layer.self_attn.out_proj(attended), p, stream + 1)
        x = layer.norm1(x + attended)
        hidden = drop(torch.relu(layer.linear1(x)), p, stream + 2)
        x = layer.norm2(x + drop(layer.linear2(hidden), p, stream + 3))
    return x


def test_dropout_places_and_masks_follow_the_formula_and_eval_has_none() -> None:
    torch.manual_seed(0)
    block = Transformer(DIM, HEADS, FFN, LAYERS, max_length=LENGTH, dropout=0.3, input_dropout=0.2, seed=7)
    x, lengths = padded_batch(DIM, lengths=LENGTHS)
    real = real_mask(lengths)
    for step in range(2):
        out = block(x, lengths)
        torch.testing.assert_close(out[real], dropout_reference(block, x, lengths, step)[real], **TOL)
    assert int(block.drop.step) == 2
    block.eval()
    plain = Transformer(DIM, HEADS, FFN, LAYERS, max_length=LENGTH)
    plain.load_state_dict(block.state_dict(), strict=False)
    torch.testing.assert_close(block(x, lengths), plain(x, lengths), **TOL)
    assert int(block.drop.step) == 2


@pytest.mark.parametrize("output", ["sequence", "last"])
def test_dropout_of_a_sample_does_not_depend_on_how_the_batch_is_split(monkeypatch, output: str) -> None:
    torch.manual_seed(0)
    whole = Transformer(
        DIM,
        HEADS,
        FFN,
        LAYERS,
        causal=True,
        sasrec=True,
        dropout=0.3,
        input_dropout=0.2,
        scale_input=True,
        output=output,
        seed=3,
    )
    half = Transformer(
        DIM,
        HEADS,
        FFN,
        LAYERS,
        causal=True,
        sasrec=True,
        dropout=0.3,
        input_dropout=0.2,
        scale_input=True,
        output=output,
        seed=3,
    )
    half.load_state_dict(whole.state_dict())
    x, lengths = padded_batch(DIM, lengths=LENGTHS)
    expected = whole(x, lengths)
    parts = []
    for first in (0, 2):
        monkeypatch.setattr(sequence_dropout, "first_global_sample", lambda batch, device, group, f=first: f)
        half.drop.step.fill_(0)
        parts.append(half(x[first : first + 2], lengths[first : first + 2]))
    torch.testing.assert_close(torch.cat(parts), expected, **TOL)


def test_concatenated_positions_widen_the_layers_as_bst() -> None:
    torch.manual_seed(0)
    position_dim = 4
    block = Transformer(DIM, HEADS, 2 * FFN, LAYERS, max_length=LENGTH, position_dim=position_dim)
    assert block.positions.shape == (LENGTH, position_dim) and block.width == DIM + position_dim
    reference = nn.ModuleList(
        nn.TransformerEncoderLayer(DIM + position_dim, HEADS, 2 * FFN, dropout=0.0, batch_first=True)
        for _ in range(LAYERS)
    )
    for theirs, ours in zip(reference, block.layers):
        theirs.load_state_dict(ours.state_dict())
    x, lengths = padded_batch(DIM, lengths=LENGTHS)
    real = real_mask(lengths)
    out = block(x, lengths)
    joined = torch.cat([x, block.positions.expand(len(LENGTHS), -1, -1)], dim=2)
    expected = run_torch(reference, joined, lengths, causal=False)
    torch.testing.assert_close(out[real], expected[real], **TOL)
    message = "Transformer: dim 8 + position_dim 3 is not divisible by num_heads 2"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Transformer(DIM, HEADS, FFN, max_length=LENGTH, position_dim=3)
