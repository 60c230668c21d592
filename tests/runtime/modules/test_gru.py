"""runtime/modules/blocks/gru.py: the `gru` block against torch.nn.GRU per sample, DIEN's AUGRU against its formula."""

from __future__ import annotations

import pytest
import torch

from runtime.modules.blocks.gru import GRU

LENGTHS = [3, 0, 5, 1]


def _batch(dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    lengths = torch.tensor(LENGTHS)
    return torch.randn(len(LENGTHS), max(LENGTHS), dim), lengths


def test_each_sample_gets_what_torch_gru_computes_on_it_alone_and_padding_stays_zero() -> None:
    x, lengths = _batch(4)
    block = GRU(4, 6, num_layers=2)
    out = block(x, lengths)
    assert out.shape == (4, 5, 6)
    for b, n in enumerate(LENGTHS):
        if n:
            alone, _ = block.gru(x[b : b + 1, :n])
            torch.testing.assert_close(out[b, :n], alone[0], rtol=1e-6, atol=1e-6)
        assert torch.equal(out[b, n:], torch.zeros(5 - n, 6))


def test_padding_values_do_not_reach_the_output_or_the_gradient() -> None:
    x, lengths = _batch(4)
    block = GRU(4, 3)
    noisy = x.clone()
    for b, n in enumerate(LENGTHS):
        noisy[b, n:] = 1e6
    noisy.requires_grad_(True)
    out = block(noisy, lengths)
    torch.testing.assert_close(out, block(x, lengths), rtol=0, atol=0)
    out.sum().backward()
    for b, n in enumerate(LENGTHS):
        assert torch.equal(noisy.grad[b, n:], torch.zeros(5 - n, 4))


def _augru_reference(block: GRU, x: torch.Tensor, lengths: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """DIEN's formulas written out per sample and per step (Zhou et al. 2019, eqs. 3-4, 11-12)."""
    cell, hidden = block.cell, block.hidden_size
    out = torch.zeros(x.shape[0], x.shape[1], hidden)
    for b, n in enumerate(lengths.tolist()):
        if not n:
            continue
        keys = x[b, :n] @ block.kernel if block.attention == "bilinear" else x[b, :n]
        raw = keys @ query[b]
        score = torch.softmax(raw, dim=0) if block.softmax else raw
        state = torch.zeros(hidden)
        w_x, w_h = cell.x2h.weight.split(hidden), cell.h2h.weight.split(hidden)
        b_x, b_h = cell.x2h.bias.split(hidden), cell.h2h.bias.split(hidden)
        for t in range(n):
            u = torch.sigmoid(w_x[0] @ x[b, t] + b_x[0] + w_h[0] @ state + b_h[0])
            r = torch.sigmoid(w_x[1] @ x[b, t] + b_x[1] + w_h[1] @ state + b_h[1])
            candidate = torch.tanh(w_x[2] @ x[b, t] + b_x[2] + r * (w_h[2] @ state + b_h[2]))
            u = score[t] * u
            state = (1 - u) * state + u * candidate
            out[b, t] = state
    return out


@pytest.mark.parametrize(("attention", "softmax"), [("bilinear", True), ("dot", False)])
def test_augru_follows_diens_update_gate_scaled_by_the_attention_score(attention: str, softmax: bool) -> None:
    x, lengths = _batch(4, seed=1)
    query = torch.randn(4, 4)
    block = GRU(4, 5, query_dim=4, attention=attention, softmax=softmax)
    if attention == "bilinear":
        with torch.no_grad():
            block.kernel.add_(0.3 * torch.randn(4, 4))  # not the identity it starts as
    torch.testing.assert_close(block(x, lengths, query), _augru_reference(block, x, lengths, query))


def test_the_softmax_scores_sum_to_one_over_the_real_positions_only() -> None:
    x, lengths = _batch(4)
    scores = GRU(4, 4, query_dim=4).scores(x, lengths, torch.randn(4, 4))
    torch.testing.assert_close(scores.sum(dim=1), torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert torch.equal(scores[0, 3:], torch.zeros(2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query_dim": 4, "num_layers": 2}, "GRU: an attention-gated GRU (AUGRU) has one layer (got num_layers=2)"),
        ({"query_dim": 3, "attention": "dot"}, "GRU: dot attention needs a query as wide as the input 4 (got 3)"),
        ({"attention": "additive"}, "GRU: unknown attention 'additive' (expected one of: bilinear, dot)"),
        ({"hidden_size": 0}, "GRU: hidden_size must be an integer >= 1 (got 0)"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        GRU(4, **{"hidden_size": 4, **kwargs})
    assert str(error.value) == message


def test_a_query_the_block_does_not_take_is_named() -> None:
    x, lengths = _batch(4)
    with pytest.raises(ValueError) as error:
        GRU(4, 4)(x, lengths, torch.zeros(4, 4))
    assert str(error.value) == "GRU: this GRU takes no query"
