"""Tests for runtime/modules/blocks/sequence_pool.py, against per-sample reductions."""

from __future__ import annotations

import re

import pytest
import torch
from sequence_inputs import padded_batch

from runtime.modules.blocks.sequence_pool import SequencePool

REDUCE = {
    "sum": lambda s: s.sum(0),
    "mean": lambda s: s.mean(0),
    "max": lambda s: s.max(0).values,
    "first": lambda s: s[0],
    "last": lambda s: s[-1],
}


@pytest.mark.parametrize("mode", list(REDUCE))
def test_pools_the_real_positions_and_empty_gives_zero(mode: str) -> None:
    x, lengths = padded_batch(dim=5)
    x.requires_grad_()
    out = SequencePool(5, mode)(x, lengths)
    expected = torch.stack([REDUCE[mode](x[b, :n]) if n else torch.zeros(5) for b, n in enumerate(lengths.tolist())])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    out.sum().backward()
    for b, n in enumerate(lengths.tolist()):
        assert x.grad[b, n:].abs().sum() == 0
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: SequencePool(5, "median"),
            "SequencePool: unknown mode 'median' (expected one of: sum, mean, max, first, last)",
        ),
        (lambda: SequencePool(0), "SequencePool: dim must be an integer >= 1 (got 0)"),
        (
            lambda: SequencePool(4)(*padded_batch(dim=5)),
            "SequencePool: expected a sequence of shape (B, L, 4), got (5, 6, 5)",
        ),
        (
            lambda: SequencePool(5)(padded_batch(dim=5)[0], torch.tensor([1, 2])),
            "SequencePool: expected lengths of shape (5,), got (2,)",
        ),
        (
            lambda: SequencePool(5)(padded_batch(dim=5)[0], torch.tensor([1, 2, 7, 0, 0])),
            "SequencePool: lengths must be in [0, 6] (got 0 to 7)",
        ),
    ],
)
def test_errors_name_the_block(call, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()
