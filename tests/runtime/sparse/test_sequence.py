"""Tests for runtime/sparse/sequence.py, against per-sample slicing in plain torch."""

from __future__ import annotations

import re

import pytest
import torch

from runtime.sparse.jagged import JaggedTensor
from runtime.sparse.sequence import PaddedLayout, padding_mask, to_jagged, to_padded, truncate

LENGTHS = [3, 0, 5, 1]


def sample_rows(lengths: list[int] = LENGTHS, dim: int = 3) -> torch.Tensor:
    return torch.randn(sum(lengths), dim, generator=torch.Generator().manual_seed(0))


def test_to_padded_puts_each_sequence_first_and_zeros_after() -> None:
    values, lengths = sample_rows(), torch.tensor(LENGTHS)
    padded = to_padded(values, lengths, max_length=6)
    expected = torch.zeros(4, 6, 3)
    for b, chunk in enumerate(torch.split(values, LENGTHS)):
        expected[b, : len(chunk)] = chunk
    torch.testing.assert_close(padded, expected, atol=0, rtol=0)
    assert padding_mask(lengths, 6).tolist() == [[j < n for j in range(6)] for n in LENGTHS]


def test_to_jagged_inverts_to_padded_and_gradients_flow_both_ways() -> None:
    values, lengths = sample_rows().requires_grad_(), torch.tensor(LENGTHS)
    padded = to_padded(values, lengths, max_length=5)
    back = to_jagged(padded, lengths)
    torch.testing.assert_close(back, values, atol=0, rtol=0)
    back.sum().backward()
    torch.testing.assert_close(values.grad, torch.ones_like(values), atol=0, rtol=0)


@pytest.mark.parametrize("keep", ["end", "start"])
def test_truncate_keeps_the_chosen_side(keep: str) -> None:
    values = torch.arange(sum(LENGTHS))
    jt = truncate(JaggedTensor(values, weights=values.float() / 10, lengths=torch.tensor(LENGTHS)), 2, keep)
    chunks = torch.split(values, LENGTHS)
    expected = [c[-2:] if keep == "end" else c[:2] for c in chunks]
    assert jt.lengths().tolist() == [2, 0, 2, 1]
    assert jt.values().tolist() == torch.cat(expected).tolist()
    torch.testing.assert_close(jt.weights(), torch.cat(expected).float() / 10)
    assert jt.offsets().tolist() == [0, 2, 2, 4, 5]


def test_truncate_rows_of_embeddings() -> None:
    values = sample_rows()
    jt = truncate(JaggedTensor(values, lengths=torch.tensor(LENGTHS)), 4)
    expected = torch.cat([c[-4:] for c in torch.split(values, LENGTHS)])
    torch.testing.assert_close(jt.values(), expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: to_padded(sample_rows(), torch.tensor(LENGTHS), 4),
            "to_padded: a sequence of length 5 is longer than max_length 4; truncate it first",
        ),
        (
            lambda: to_padded(sample_rows()[:3], torch.tensor(LENGTHS), 6),
            "to_padded: expected values of shape (sum(lengths) = 9, D), got (3, 3)",
        ),
        (
            lambda: to_padded(sample_rows(), torch.tensor(LENGTHS), 0),
            "to_padded: max_length must be an integer >= 1 (got 0)",
        ),
        (
            lambda: to_jagged(torch.zeros(4, 3, 2), torch.tensor(LENGTHS)),
            "to_jagged: a sequence of length 5 does not fit in 3 positions",
        ),
        (
            lambda: to_jagged(torch.zeros(3, 5, 2), torch.tensor(LENGTHS)),
            "to_jagged: expected a padded tensor of shape (B = 4, L, D), got (3, 5, 2)",
        ),
        (
            lambda: truncate(JaggedTensor(torch.arange(9), lengths=torch.tensor(LENGTHS)), 2, "middle"),
            "truncate: keep must be 'end' or 'start' (got 'middle')",
        ),
    ],
)
def test_errors_name_the_helper_and_the_numbers(call, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def test_padded_layout_converts_like_the_checked_helpers() -> None:
    values, lengths = sample_rows(), torch.tensor(LENGTHS)
    layout = PaddedLayout(lengths, 6)
    padded = layout.padded(values)
    torch.testing.assert_close(padded, to_padded(values, lengths, 6), atol=0, rtol=0)
    torch.testing.assert_close(layout.rows(padded), values, atol=0, rtol=0)
    assert layout.mask.tolist() == padding_mask(lengths, 6).tolist()
    assert layout.total == sum(LENGTHS)
