"""Synthetic batches: deterministic, sliced per rank without overlap, within the spec's ranges."""

from __future__ import annotations

import pytest
import torch

from runtime.config.data import DenseFeatureConfig, ModelInputs, SparseFeatureConfig
from runtime.config.heads import HeadConfig
from runtime.config.training import TrainingConfig
from runtime.data.synthetic.batches import make_batch

INPUTS = ModelInputs(
    dense=(DenseFeatureConfig("int", 5),),
    sparse=(
        SparseFeatureConfig("a", "ta", 50, ids_per_sample=3, fixed_ids=True, weighted=False),
        SparseFeatureConfig("b", "tb", 7, ids_per_sample=4, fixed_ids=False, weighted=True),
    ),
    heads=(
        HeadConfig("click", "bce", "click"),
        HeadConfig("rating", "mse", "rating"),
        HeadConfig("genre", "softmax", "genre", num_classes=4),
    ),
    training=TrainingConfig(steps=10, batch_size=16, seed=0),
)


def _per_key(batch, key):
    jt = batch.sparse[key]
    return jt.lengths(), jt.values(), jt.weights_or_none()


def test_same_seed_and_step_give_the_same_batch() -> None:
    one, two = make_batch(INPUTS, 16, step=3, seed=5), make_batch(INPUTS, 16, step=3, seed=5)
    assert torch.equal(one.dense["int"], two.dense["int"])
    assert torch.equal(one.sparse.values(), two.sparse.values())
    assert all(torch.equal(one.labels[k], two.labels[k]) for k in one.labels)
    other = make_batch(INPUTS, 16, step=4, seed=5)
    assert not torch.equal(one.dense["int"], other.dense["int"])


def test_rank_slices_concatenate_to_the_global_batch() -> None:
    whole = make_batch(INPUTS, 12, step=1, seed=0)
    parts = [make_batch(INPUTS, 12, step=1, seed=0, rank=r, world_size=3) for r in range(3)]
    assert [p.batch_size for p in parts] == [4, 4, 4]
    assert torch.equal(torch.cat([p.dense["int"] for p in parts]), whole.dense["int"])
    for label in whole.labels:
        assert torch.equal(torch.cat([p.labels[label] for p in parts]), whole.labels[label])
    for key in ("a", "b"):
        lengths, values, weights = _per_key(whole, key)
        assert torch.equal(torch.cat([_per_key(p, key)[0] for p in parts]), lengths)
        assert torch.equal(torch.cat([_per_key(p, key)[1] for p in parts]), values)
        if weights is not None:
            assert torch.equal(torch.cat([_per_key(p, key)[2] for p in parts]), weights)


def test_ids_lengths_and_labels_respect_the_spec() -> None:
    batch = make_batch(INPUTS, 64, step=0, seed=1)
    batch.sparse.validate()
    lengths_a, values_a, _ = _per_key(batch, "a")
    lengths_b, values_b, weights_b = _per_key(batch, "b")
    assert torch.all(lengths_a == 3)
    assert lengths_b.min() >= 0 and lengths_b.max() <= 4
    assert values_a.min() >= 0 and values_a.max() < 50
    assert values_b.min() >= 0 and values_b.max() < 7
    assert weights_b is not None and weights_b.numel() == values_b.numel()
    assert set(batch.labels["click"].unique().tolist()) <= {0.0, 1.0}
    assert batch.labels["rating"].dtype == torch.float32
    assert set(batch.labels["genre"].unique().tolist()) <= {0, 1, 2, 3}


def test_labels_carry_a_signal_from_the_inputs() -> None:
    """The dense features alone predict the click label better than chance."""
    batch = make_batch(INPUTS, 4096, step=0, seed=2)
    x, y = batch.dense["int"], batch.labels["click"]
    w = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1)], 1), y[:, None]).solution
    predicted = (torch.cat([x, torch.ones(len(x), 1)], 1) @ w).squeeze(1) > 0.5
    assert (predicted == y.bool()).float().mean() > 0.6


def test_uneven_batch_is_an_error() -> None:
    with pytest.raises(ValueError, match="^global batch size 10 does not divide evenly over 4 ranks$"):
        make_batch(INPUTS, 10, step=0, rank=0, world_size=4)
