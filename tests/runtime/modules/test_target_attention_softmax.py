"""target_attention with `normalize: softmax`, against TorchEasyRec's DINEncoder computation.

TorchEasyRec (tzrec/modules/sequence.py, DINEncoder.forward) scores
[q, k, q - k, q * k] with its MLP and a last linear layer, sets padding to
-(2**31) + 1, takes the softmax over the positions and the weighted sum of
the sequence (whose padding rows are zero).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from sequence_inputs import padded_batch

from runtime.modules.blocks.target_attention import TargetAttention


def din_encoder(
    block: TargetAttention, query: torch.Tensor, sequence: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    length = sequence.shape[1]
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    sequence = sequence * mask.unsqueeze(-1)  # TorchEasyRec's padded embeddings are zeros
    queries = query.unsqueeze(1).expand(-1, length, -1)
    features = torch.cat([queries, sequence, queries - sequence, queries * sequence], dim=-1)
    attn_output = block.scorer(features.flatten(0, 1)).view(-1, length, 1)  # TorchEasyRec's MLP(dim=3)
    attn_output = attn_output.transpose(1, 2)
    padding = torch.ones_like(attn_output) * (-(2**31) + 1)
    scores = F.softmax(torch.where(mask.unsqueeze(1), attn_output, padding), dim=-1)
    return torch.matmul(scores, sequence).squeeze(1)


def test_softmax_weights_equal_torcheasyrec_din_and_an_empty_sequence_is_zero() -> None:
    torch.manual_seed(0)
    keys, lengths = padded_batch(dim=4)
    query = torch.randn(keys.shape[0], 4)
    block = TargetAttention(4, (16, 8), "relu", normalize="softmax")
    keys.requires_grad_()
    out = block(query, keys, lengths)
    torch.testing.assert_close(out, din_encoder(block, query, keys, lengths), atol=1e-5, rtol=0)
    assert out[1].abs().sum() == 0  # the empty sequence
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in block.parameters()) and torch.isfinite(keys.grad).all()


def test_softmax_weights_sum_to_one() -> None:
    # One key repeated: the weights sum to one whatever the length, so the output is the key.
    block = TargetAttention(4, (8,), normalize="softmax")
    query, key = torch.randn(1, 4), torch.randn(4)
    keys = key.expand(1, 6, 4).clone()
    for n in (1, 6):
        torch.testing.assert_close(block(query, keys, torch.tensor([n]))[0], key, atol=1e-6, rtol=0)


def test_an_unknown_normalization_is_named() -> None:
    message = "TargetAttention: unknown normalize 'sum' (expected one of: none, softmax)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        TargetAttention(4, normalize="sum")
