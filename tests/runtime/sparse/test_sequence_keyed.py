"""Tests of the graph-edge helpers of runtime/sparse/sequence.py: truncate_keyed, pool_rows, pad_times."""

from __future__ import annotations

import pytest
import torch

from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor
from runtime.sparse.sequence import pad_times, pool_rows, truncate_keyed


def batch(weighted: bool = False) -> KeyedJaggedTensor:
    # keys a (pooled), h (sequence), t (its timestamps); 3 samples each
    bags = {
        "a": [[1, 2], [], [3]],
        "h": [[10, 11, 12, 13], [14], [15, 16, 17]],
        "t": [[100, 101, 102, 103], [104], [105, 106, 107]],
    }
    values = [v for bag_list in bags.values() for bag in bag_list for v in bag]
    lengths = [len(bag) for bag_list in bags.values() for bag in bag_list]
    weights = torch.arange(len(values), dtype=torch.float32) / 10 if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(list(bags), torch.tensor(values), torch.tensor(lengths), weights=weights)


def bags(kjt: KeyedJaggedTensor, key: str) -> list[list[int]]:
    jt = kjt[key]
    values, offsets = jt.values().tolist(), jt.offsets().tolist()
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def test_truncate_keyed_cuts_the_listed_keys_to_their_side() -> None:
    cut = truncate_keyed(batch(), {"h": (2, "end"), "t": (2, "start")})
    assert cut.keys() == ["a", "h", "t"]
    assert bags(cut, "a") == [[1, 2], [], [3]]
    assert bags(cut, "h") == [[12, 13], [14], [16, 17]]
    assert bags(cut, "t") == [[100, 101], [104], [105, 106]]


def test_truncate_keyed_cuts_weights_alike_and_returns_the_batch_itself_when_nothing_is_longer() -> None:
    features = batch(weighted=True)
    cut = truncate_keyed(features, {"h": (3, "end")})
    h_weights = features["h"].weights().tolist()
    assert cut["h"].weights().tolist() == h_weights[1:4] + h_weights[4:5] + h_weights[5:8]
    assert truncate_keyed(features, {"h": (4, "end"), "absent": (1, "end")}) is features


def test_truncate_keyed_names_a_bad_limit() -> None:
    with pytest.raises(ValueError, match=r"^truncate_keyed: key 'h': keep must be 'end' or 'start' \(got 'last'\)$"):
        truncate_keyed(batch(), {"h": (2, "last")})
    with pytest.raises(ValueError, match=r"^truncate_keyed: key 'h': max_length must be an integer >= 1 \(got 0\)$"):
        truncate_keyed(batch(), {"h": (0, "end")})


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pool_rows_equals_pooling_each_bag(mode: str, weighted: bool) -> None:
    torch.manual_seed(0)
    lengths = torch.tensor([2, 0, 3, 1])
    rows = torch.randn(6, 4, dtype=torch.float64)
    weights = torch.rand(6, dtype=torch.float64) if weighted else None
    pooled = pool_rows(JaggedTensor(rows, lengths=lengths), mode, weights)
    expected, start = [], 0
    for n in lengths.tolist():
        bag = rows[start : start + n] * (weights[start : start + n, None] if weighted else 1)
        total = bag.sum(0)
        expected.append(total / max(n, 1) if mode == "mean" else total)
        start += n
    torch.testing.assert_close(pooled, torch.stack(expected), rtol=0, atol=1e-12)


def test_pool_rows_gradient_reaches_each_row() -> None:
    rows = torch.randn(3, 2, requires_grad=True)
    pool_rows(JaggedTensor(rows, lengths=torch.tensor([1, 2])), "mean").sum().backward()
    assert rows.grad.tolist() == [[1.0, 1.0], [0.5, 0.5], [0.5, 0.5]]


def test_pad_times_pads_with_zeros_and_refuses_longer_sequences() -> None:
    times = JaggedTensor(torch.tensor([5, 6, 7, 9]), lengths=torch.tensor([3, 0, 1]))
    assert pad_times(times, 3).tolist() == [[5, 6, 7], [0, 0, 0], [9, 0, 0]]
    with pytest.raises(ValueError, match=r"^pad_times: a sequence of length 3 is longer than max_length 2; "):
        pad_times(times, 2)


def test_pad_times_refuses_times_whose_lengths_differ_from_their_sequences_ids() -> None:
    times = JaggedTensor(torch.tensor([5, 6, 7, 9]), lengths=torch.tensor([3, 0, 1]))
    assert pad_times(times, 3, torch.tensor([3, 0, 1])).tolist() == [[5, 6, 7], [0, 0, 0], [9, 0, 0]]
    with pytest.raises(ValueError) as refused:
        pad_times(times, 3, torch.tensor([3, 1, 0]))
    assert (
        str(refused.value) == "pad_times: sample 1 has 0 timestamps but 1 ids in its sequence; each id needs its time"
    )
    with pytest.raises(ValueError) as refused:
        pad_times(times, 3, torch.tensor([3, 0]))
    assert str(refused.value) == "pad_times: timestamps for 3 samples but their sequence has 2"
