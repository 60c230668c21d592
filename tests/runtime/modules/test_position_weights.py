"""runtime/modules/layers/position_weights.py against its formula: out[b] = sum_j w[j] * rows[b][j] (mean: / L_b)."""

from __future__ import annotations

import pytest
import torch

from runtime.modules.layers.position_weights import PositionWeightedPool, PositionWeights, positions
from runtime.sparse.jagged import JaggedTensor
from runtime.sparse.sequence import pool_rows

LENGTHS = [3, 0, 1, 4, 2]


def _rows(dim: int = 5, seed: int = 0) -> JaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(sum(LENGTHS), dim, generator=gen, dtype=torch.float64)
    return JaggedTensor(values, lengths=torch.tensor(LENGTHS))


def _reference(rows: JaggedTensor, weight: torch.Tensor, mode: str) -> torch.Tensor:
    out, start = [], 0
    for length in LENGTHS:
        bag = rows.values()[start : start + length]
        total = sum((weight[j] * bag[j] for j in range(length)), torch.zeros(bag.shape[1], dtype=bag.dtype))
        out.append(total / max(length, 1) if mode == "mean" else total)
        start += length
    return torch.stack(out)


def test_positions_count_from_0_within_each_bag() -> None:
    assert positions(torch.tensor(LENGTHS)).tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 0, 1]
    assert positions(torch.tensor([], dtype=torch.long)).tolist() == []


def test_weights_start_at_1_so_the_pool_is_plain_pooling() -> None:
    pool = PositionWeightedPool(4, "sum", "tags").double()
    rows = _rows()
    assert torch.equal(pool.weight.detach(), torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(pool(rows), pool_rows(rows, "sum"), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_pool_and_its_gradients_match_the_formula(mode: str) -> None:
    pool = PositionWeightedPool(4, mode, "tags").double()
    with torch.no_grad():
        pool.weight.copy_(torch.tensor([0.5, -1.5, 2.0, 3.0]))
    rows = _rows()
    values = rows.values().clone().requires_grad_(True)
    weight = pool.weight.detach().clone().requires_grad_(True)
    got = pool(JaggedTensor(values, lengths=rows.lengths()))
    expected = _reference(JaggedTensor(values, lengths=rows.lengths()), weight, mode)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    upstream = torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad((got * upstream).sum(), [values, pool.weight])
    want = torch.autograd.grad((expected * upstream).sum(), [values, weight])
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_bag_longer_than_its_weights_names_the_feature() -> None:
    pool = PositionWeightedPool(3, "sum", "tags", where="spec.yaml:7:5")
    with pytest.raises(ValueError) as caught:
        pool(JaggedTensor(torch.zeros(10, 5), lengths=torch.tensor(LENGTHS)))
    assert str(caught.value) == "spec.yaml:7:5: feature 'tags': a bag of 4 ids is longer than its 3 position weights"


def test_the_model_module_holds_one_pool_per_feature() -> None:
    pools = PositionWeights([PositionWeightedPool(3, "sum", "a"), PositionWeightedPool(5, "mean", "b")])
    assert list(pools) == ["a", "b"]
    assert sorted(name for name, _ in pools.named_parameters()) == ["a.weight", "b.weight"]
