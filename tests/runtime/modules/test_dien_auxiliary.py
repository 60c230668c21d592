"""runtime/modules/blocks/dien_auxiliary.py: DIEN's auxiliary loss against a direct per-position computation."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.modules.blocks.dien_auxiliary import AuxiliaryNet, auxiliary_loss
from runtime.retrieval.sampling import per_query_negatives

LENGTHS = [3, 0, 5, 1, 2]
MAX_LENGTH = 6


def _inputs(seed: int = 0) -> tuple[AuxiliaryNet, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    batch, length = len(LENGTHS), max(LENGTHS)
    net = AuxiliaryNet(hidden_size=4, item_dim=3)
    states = torch.randn(batch, length, 4)
    items, negatives = torch.randn(batch, length, 3), torch.randn(batch, length, 3)
    return net, states, items, negatives, torch.tensor(LENGTHS)


def _click_probability(net: AuxiliaryNet, state: torch.Tensor, item: torch.Tensor) -> float:
    """The authors' auxiliary_net on one pair, written out: softmax(f3(sigmoid(f2(sigmoid(f1(x))))))[0]."""
    f1, _, f2, _, f3 = net.layers
    x = torch.cat([state, item]).detach().double()
    hidden = torch.sigmoid(f1.weight.detach().double() @ x + f1.bias.detach().double())
    hidden = torch.sigmoid(f2.weight.detach().double() @ hidden + f2.bias.detach().double())
    logits = f3.weight.detach().double() @ hidden + f3.bias.detach().double()
    return float(torch.exp(logits[0]) / torch.exp(logits).sum())


def test_the_loss_is_the_authors_mean_over_the_batch_and_max_length_minus_one_positions() -> None:
    net, states, items, negatives, lengths = _inputs()
    expected = 0.0
    for b, n in enumerate(LENGTHS):
        for t in range(n - 1):
            expected -= math.log(_click_probability(net, states[b, t], items[b, t + 1]))
            expected -= math.log(1.0 - _click_probability(net, states[b, t], negatives[b, t + 1]))
    expected /= len(LENGTHS) * (MAX_LENGTH - 1)
    got = auxiliary_loss(net, states, items, negatives, lengths, MAX_LENGTH)
    assert got.item() == pytest.approx(expected, rel=1e-5)


def test_padding_and_the_last_real_position_do_not_reach_the_loss_or_the_gradient() -> None:
    net, states, items, negatives, lengths = _inputs()
    noisy = [t.clone() for t in (states, items, negatives)]
    for b, n in enumerate(LENGTHS):
        noisy[0][b, max(n - 1, 0) :] = 1e6  # the state after the last behaviour scores nothing
        noisy[1][b, n:] = 1e6
        noisy[2][b, n:] = 1e6
        noisy[2][b, 0] = 1e6  # position 0 is never anyone's next item
    for t in noisy:
        t.requires_grad_(True)
    loss = auxiliary_loss(net, *noisy, lengths, MAX_LENGTH)
    assert loss.item() == pytest.approx(auxiliary_loss(net, states, items, negatives, lengths, MAX_LENGTH).item())
    loss.backward()
    for b, n in enumerate(LENGTHS):
        assert torch.equal(noisy[0].grad[b, max(n - 1, 0) :], torch.zeros_like(noisy[0].grad[b, max(n - 1, 0) :]))
        assert torch.equal(noisy[1].grad[b, n:], torch.zeros_like(noisy[1].grad[b, n:]))
        assert torch.equal(noisy[2].grad[b, 0], torch.zeros(3))


def test_histories_of_length_0_and_1_give_zero_and_zero_gradients_not_none() -> None:
    net, states, items, negatives, _ = _inputs()
    lengths = torch.tensor([1, 0, 1, 0, 1])
    loss = auxiliary_loss(net, states[:, :1], items[:, :1], negatives[:, :1], lengths, MAX_LENGTH)
    assert loss.item() == 0.0
    loss.backward()
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())


def test_two_halves_averaged_equal_the_whole_batch_as_two_ranks_average_their_gradients() -> None:
    net, states, items, negatives, lengths = _inputs()
    whole = auxiliary_loss(net, states[:4], items[:4], negatives[:4], lengths[:4], MAX_LENGTH)
    halves = [
        auxiliary_loss(net, states[rows], items[rows], negatives[rows], lengths[rows], MAX_LENGTH)
        for rows in (slice(0, 2), slice(2, 4))
    ]
    torch.testing.assert_close(whole, (halves[0] + halves[1]) / 2, rtol=1e-6, atol=0)


def test_a_max_length_below_two_or_the_padded_length_is_refused() -> None:
    net, states, items, negatives, lengths = _inputs()
    with pytest.raises(ValueError) as error:
        auxiliary_loss(net, states, items, negatives, lengths, 4)
    assert str(error.value) == "auxiliary_loss: max_length must be >= 2 and >= the padded length 5 (got 4)"


def test_negatives_drawn_per_position_for_each_ranks_rows_give_two_ranks_the_one_process_loss() -> None:
    """The draw the wiring is to use: retrieval's per_query_negatives with the history's positions as samples."""
    net, states, items, _, lengths = _inputs()
    table = torch.randn(50, 3)

    def loss(rows: slice) -> torch.Tensor:
        ids = per_query_negatives(seed=7, step=3, queries=rows, total_queries=4, num_samples=MAX_LENGTH, num_items=50)
        negatives = table[ids[:, : states.shape[1]]]
        return auxiliary_loss(net, states[rows], items[rows], negatives, lengths[rows], MAX_LENGTH)

    one_process = loss(slice(0, 4))
    ranks = (loss(slice(0, 2)) + loss(slice(2, 4))) / 2
    torch.testing.assert_close(ranks, one_process, rtol=1e-6, atol=0)
    assert loss(slice(0, 4)).item() == one_process.item()  # the same (seed, step) draws the same ids
