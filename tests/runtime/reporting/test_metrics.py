"""Metrics against direct formulas, and 2 ranks against 1 (torch.multiprocessing, gloo on loopback)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import rendezvous
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.config.heads import HeadConfig
from runtime.reporting.metrics import MetricSet, auc, normalized_entropy
from runtime.train.process_group import close_process_group

HEADS = [
    HeadConfig("click", "bce", "click", metrics=("ne", "auc", "accuracy")),
    HeadConfig("rating", "mse", "stars", metrics=("mse", "rmse")),
    HeadConfig("genre", "softmax", "genre", num_classes=3, metrics=("accuracy",)),
]


def _data(n: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, generator=gen) * 2).round(decimals=1)  # rounding makes ties
    clicks = torch.bernoulli(torch.sigmoid(logits + torch.randn(n, generator=gen)), generator=gen)
    values, stars = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    classes, genre = torch.randn(n, 4, generator=gen), torch.randint(0, 4, (n,), generator=gen)
    return {"click": logits, "rating": values, "genre": classes}, {"click": clicks, "stars": stars, "genre": genre}


def _reference_auc(scores: list[float], labels: list[float]) -> float:
    """Mann-Whitney from sorted ranks: ties share the average of their ranks."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    positives = [r for r, y in zip(ranks, labels) if y == 1]
    p, n = len(positives), len(labels) - len(positives)
    return (sum(positives) - p * (p + 1) / 2) / (p * n)


def test_auc_matches_the_sorted_rank_reference_with_ties() -> None:
    outputs, labels = _data(500)
    scores = outputs["click"]
    assert len(set(scores.tolist())) < 200  # many ties
    expected = _reference_auc(scores.tolist(), labels["click"].tolist())
    assert auc(scores.double(), labels["click"].double()) == pytest.approx(expected, abs=1e-12)
    constant = torch.zeros(6, dtype=torch.float64)
    assert auc(constant, torch.tensor([0.0, 1, 0, 1, 1, 0])) == pytest.approx(0.5)
    assert auc(torch.arange(4.0), torch.ones(4)) is None


def test_ne_accuracy_mse_rmse_match_direct_formulas() -> None:
    outputs, labels = _data(300)
    metrics = MetricSet(HEADS)
    metrics.update(outputs, labels)
    values = metrics.compute()
    p = torch.sigmoid(outputs["click"].double())
    y = labels["click"].double()
    log_loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean().item()
    rate = y.mean().item()
    baseline = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    assert values["click"]["ne"] == pytest.approx(log_loss / baseline, rel=1e-9)
    assert values["click"]["accuracy"] == pytest.approx(((p >= 0.5).double() == y).double().mean().item())
    mse = (outputs["rating"] - labels["stars"]).double().pow(2).mean().item()
    assert values["rating"] == {"mse": pytest.approx(mse), "rmse": pytest.approx(math.sqrt(mse))}
    accuracy = (outputs["genre"].argmax(1) == labels["genre"]).double().mean().item()
    assert values["genre"]["accuracy"] == pytest.approx(accuracy)
    assert list(values["click"]) == ["ne", "auc", "accuracy"]


def test_log_loss_beside_ne_is_the_mean_binary_cross_entropy() -> None:
    outputs, labels = _data(300, seed=4)
    metrics = MetricSet([HeadConfig("click", "bce", "click", metrics=("ne", "log_loss"))])
    metrics.update({"click": outputs["click"]}, {"click": labels["click"]})
    got = metrics.compute()["click"]
    p, y = torch.sigmoid(outputs["click"].double()), labels["click"].double()
    log_loss = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
    rate = float(y.mean())
    assert got["log_loss"] == pytest.approx(log_loss, rel=1e-12)
    assert got["ne"] == pytest.approx(log_loss / -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)), rel=1e-12)


def test_compute_starts_a_new_window_and_padding_is_left_out() -> None:
    outputs, labels = _data(40)
    metrics = MetricSet(HEADS)
    metrics.update(outputs, labels, real=30)
    padded = metrics.compute()
    whole = MetricSet(HEADS)
    whole.update({k: v[:30] for k, v in outputs.items()}, {k: v[:30] for k, v in labels.items()})
    assert padded == whole.compute()
    assert metrics.compute()["click"] == {"ne": None, "auc": None, "accuracy": None}
    assert normalized_entropy(3.0, 0.0, 10.0) is None  # no positives: NE is undefined


def _rank(rank: int, port: int, out: str) -> None:
    rendezvous.join_gloo(rank, port)
    outputs, labels = _data(301)
    lo, hi = (0, 170) if rank == 0 else (170, 301)  # unequal shares: the gather pads
    metrics = MetricSet(HEADS)
    for start in range(lo, hi, 50):  # several updates per rank
        end = min(start + 50, hi)
        metrics.update({k: v[start:end] for k, v in outputs.items()}, {k: v[start:end] for k, v in labels.items()})
    values = metrics.compute(dist.group.WORLD)
    if rank == 0:
        Path(out).write_text(json.dumps(values))
    close_process_group()


def test_two_ranks_give_the_one_rank_metrics(tmp_path: Path) -> None:
    out = tmp_path / "metrics.json"
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(out)), nprocs=2, join=True)
    outputs, labels = _data(301)
    single = MetricSet(HEADS)
    single.update(outputs, labels)
    expected = single.compute()
    gathered = json.loads(out.read_text())
    for head, values in expected.items():
        for name, value in values.items():
            assert gathered[head][name] == pytest.approx(value, rel=1e-12), (head, name)
