"""Tests for runtime/modules/blocks/target_attention.py, against a loop over samples and positions."""

from __future__ import annotations

import re

import pytest
import torch
from sequence_inputs import padded_batch

from runtime.modules.blocks.target_attention import TargetAttention

ACT = {"sigmoid": torch.sigmoid, "relu": torch.relu, "tanh": torch.tanh}


def loop_reference(block: TargetAttention, act: str, query, keys, lengths) -> torch.Tensor:
    """DIN written out: a score per real position from the MLP's weights, then the weighted sum."""
    layers = list(block.scorer.linears)
    outputs = []
    for b, n in enumerate(lengths.tolist()):
        total = torch.zeros(block.dim)
        for l in range(n):
            q, k = query[b], keys[b, l]
            h = torch.cat([q, k, q - k, q * k])
            for i, layer in enumerate(layers):
                h = layer.weight @ h + layer.bias
                if i < len(layers) - 1:
                    h = ACT[act](h)
            total = total + h[0] * k
        outputs.append(total)
    return torch.stack(outputs)


@pytest.mark.parametrize(("hidden", "act"), [((16, 8), "sigmoid"), ((12,), "relu"), ((6, 6, 4), "tanh")])
def test_matches_the_loop_reference(hidden: tuple[int, ...], act: str) -> None:
    torch.manual_seed(0)
    keys, lengths = padded_batch(dim=4)
    query = torch.randn(keys.shape[0], 4)
    block = TargetAttention(4, hidden, act)
    out = block(query, keys, lengths)
    torch.testing.assert_close(out, loop_reference(block, act, query, keys, lengths), atol=1e-5, rtol=0)
    assert out[1].abs().sum() == 0  # the empty sequence


def test_scores_are_not_normalised() -> None:
    # One key repeated: the output is the sum of the (equal) scores times the key, growing with L.
    block = TargetAttention(4, (8,))
    query, key = torch.randn(1, 4), torch.randn(4)
    keys = key.expand(1, 6, 4).clone()
    one, six = block(query, keys, torch.tensor([1])), block(query, keys, torch.tensor([6]))
    torch.testing.assert_close(six, 6 * one, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: TargetAttention(4, (8,), "swish"),
            "TargetAttention: unknown activation 'swish' (expected one of: dice, gelu, none, prelu, relu, sigmoid, silu, tanh)",
        ),
        (lambda: TargetAttention(4, []), "TargetAttention: hidden must be a non-empty list of sizes (got [])"),
        (
            lambda: TargetAttention(4)(torch.zeros(5, 3), *padded_batch(dim=4)),
            "TargetAttention: expected a query of shape (5, 4), got (5, 3)",
        ),
        (
            lambda: TargetAttention(4)(torch.zeros(5, 4), torch.zeros(5, 4), torch.tensor([1] * 5)),
            "TargetAttention: expected a sequence of shape (B, L, 4), got (5, 4)",
        ),
    ],
)
def test_errors_name_the_block(call, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()
