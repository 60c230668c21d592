"""Synthetic sequence features: lengths, id ranges, timestamps, determinism, rank slices and the signal."""

from __future__ import annotations

import math

import torch

from runtime.config.data import ModelInputs, SparseFeatureConfig, TimestampsConfig
from runtime.config.heads import HeadConfig
from runtime.config.training import TrainingConfig
from runtime.data.synthetic.batches import make_batch
from runtime.data.synthetic.sequences import latent_class

DIN = ModelInputs(
    dense=(),
    sparse=(
        SparseFeatureConfig("user", "user", 100),
        SparseFeatureConfig("item", "items", 200),
        SparseFeatureConfig("history", "items", 200, max_length=20),
    ),
    heads=(HeadConfig("click", "bce", "click"), HeadConfig("rating", "mse", "rating")),
    training=TrainingConfig(steps=10, batch_size=256, seed=0),
    timestamps=(TimestampsConfig("history_time", "history"),),
)


def _bags(batch, key: str) -> list[list[int]]:
    jt = batch.sparse[key]
    return [row.tolist() for row in torch.split(jt.values(), jt.lengths().tolist())]


def test_keys_lengths_ids_and_timestamps() -> None:
    batch = make_batch(DIN, 512, step=0, seed=3)
    batch.sparse.validate()
    assert batch.sparse.keys() == ["user", "item", "history", "history_time"]
    history, times = batch.sparse["history"], batch.sparse["history_time"]
    assert torch.equal(history.lengths(), times.lengths())
    assert history.lengths().min() == 0 and history.lengths().max() == 20
    assert history.values().min() >= 0 and history.values().max() < 200
    assert times.values().dtype == torch.int64
    for stamps in _bags(batch, "history_time"):
        assert all(a < b for a, b in zip(stamps, stamps[1:]))
        assert all(1_500_000_000 <= s < 1_700_000_000 for s in stamps)


def test_histories_lean_towards_one_class() -> None:
    """PURITY: about 80% of a long history is of its majority class."""
    batch = make_batch(DIN, 1024, step=0, seed=4)
    shares = []
    for bag in _bags(batch, "history"):
        if len(bag) >= 15:
            ones = int(latent_class(torch.tensor(bag), "items").sum())
            shares.append(max(ones, len(bag) - ones) / len(bag))
    assert 0.76 < sum(shares) / len(shares) < 0.86


def test_sequences_are_deterministic_per_seed_and_step() -> None:
    one, two = make_batch(DIN, 64, step=5, seed=1), make_batch(DIN, 64, step=5, seed=1)
    assert torch.equal(one.sparse.values(), two.sparse.values())
    assert torch.equal(one.sparse.lengths(), two.sparse.lengths())
    assert torch.equal(one.labels["click"], two.labels["click"])
    other = make_batch(DIN, 64, step=6, seed=1)
    assert not torch.equal(one.sparse["history"].lengths(), other.sparse["history"].lengths())


def test_rank_slices_of_sequences_concatenate_to_the_global_batch() -> None:
    whole = make_batch(DIN, 12, step=2, seed=0)
    parts = [make_batch(DIN, 12, step=2, seed=0, rank=r, world_size=3) for r in range(3)]
    for key in ("user", "item", "history", "history_time"):
        assert sum((_bags(p, key) for p in parts), []) == _bags(whole, key)
    assert torch.equal(torch.cat([p.labels["click"] for p in parts]), whole.labels["click"])


def test_pooled_features_do_not_change_when_a_sequence_is_added() -> None:
    pooled = ModelInputs(DIN.dense, DIN.sparse[:2], DIN.heads, DIN.training)
    without, with_ = make_batch(pooled, 32, step=1, seed=2), make_batch(DIN, 32, step=1, seed=2)
    for key in ("user", "item"):
        assert _bags(without, key) == _bags(with_, key)


def test_a_small_din_model_learns_the_history_signal() -> None:
    """A target-item x mean-history model beats the constant predictor's loss clearly in 100 steps."""
    torch.manual_seed(0)
    history = torch.nn.EmbeddingBag(200, 8, mode="mean")
    item = torch.nn.Embedding(200, 8)
    mlp = torch.nn.Sequential(torch.nn.Linear(24, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    modules = torch.nn.ModuleList([history, item, mlp])
    optimizer = torch.optim.Adam(modules.parameters(), lr=0.02)

    def logits(batch):
        seq = batch.sparse["history"]
        h, q = history(seq.values(), seq.offsets()[:-1]), item(batch.sparse["item"].values())
        return mlp(torch.cat([q, h, q * h], dim=1)).squeeze(1)

    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for step in range(100):
        batch = make_batch(DIN, 256, step, seed=1)
        loss = bce(logits(batch), batch.labels["click"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    held_out = make_batch(DIN, 4096, 10_000, seed=1)
    rate = float(held_out.labels["click"].mean())
    constant = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    with torch.no_grad():
        learned = float(bce(logits(held_out), held_out.labels["click"]))
    assert 0.45 < rate < 0.55
    assert learned < constant - 0.15, (learned, constant)


def test_without_a_target_the_label_follows_the_history_majority() -> None:
    inputs = ModelInputs((), DIN.sparse[2:], DIN.heads[:1], DIN.training, timestamps=DIN.timestamps)
    batch = make_batch(inputs, 4096, step=0, seed=5)
    majority = []
    for bag in _bags(batch, "history"):
        ones = int(latent_class(torch.tensor(bag, dtype=torch.long), "items").sum())
        majority.append(float(2 * ones > len(bag)) if 2 * ones != len(bag) else 0.5)
    majority_t = torch.tensor(majority)
    clicks = batch.labels["click"]
    assert float(clicks[majority_t == 1.0].mean()) > 0.8
    assert float(clicks[majority_t == 0.0].mean()) < 0.2
