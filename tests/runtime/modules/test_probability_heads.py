"""Heads whose output is already a probability (`output: probability`): loss, metrics and scores read it as is.

Each is compared with the same head on the logit of that probability (which
must agree where nothing is clamped) and with the direct formula; a
probability of exactly 0 or 1 costs 100 per sample, as torch's BCELoss clamps
each log at -100.
"""

from __future__ import annotations

import math

import pytest
import torch

from runtime.config.heads import HeadConfig
from runtime.modules.heads.losses import total_loss
from runtime.reporting.metrics import MetricSet, auc
from runtime.serving.export_dir import head_scores

LOGIT = HeadConfig("ctcvr", "bce", "ctcvr")
PROBABILITY = HeadConfig("ctcvr", "bce", "ctcvr", output="probability")


def _data(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(n, generator=gen, dtype=torch.float64) * 2
    labels = torch.bernoulli(torch.sigmoid(logits), generator=gen)
    return logits, labels


def test_the_loss_is_bce_on_the_probability_and_equals_the_logit_heads() -> None:
    logits, labels = _data()
    p = torch.sigmoid(logits)
    got = total_loss({"ctcvr": p}, {"ctcvr": labels}, [PROBABILITY])
    expected = -(labels * torch.log(p) + (1 - labels) * torch.log1p(-p)).mean()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, total_loss({"ctcvr": logits}, {"ctcvr": labels}, [LOGIT]), rtol=1e-9, atol=0.0)


def test_certain_wrong_probabilities_cost_100_not_inf() -> None:
    p, labels = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0])
    assert total_loss({"ctcvr": p}, {"ctcvr": labels}, [PROBABILITY]).item() == pytest.approx(200 / 3)
    metrics = MetricSet([HeadConfig("ctcvr", "bce", "ctcvr", metrics=("ne",), output="probability")])
    metrics.update({"ctcvr": p}, {"ctcvr": labels})
    rate = 1 / 3
    baseline = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    assert metrics.compute()["ctcvr"]["ne"] == pytest.approx(200 / 3 / baseline)


def test_metrics_of_a_probability_equal_those_of_its_logit() -> None:
    logits, labels = _data()
    by_logit, by_probability = MetricSet([LOGIT]), MetricSet([PROBABILITY])
    by_logit.update({"ctcvr": logits}, {"ctcvr": labels})
    by_probability.update({"ctcvr": torch.sigmoid(logits)}, {"ctcvr": labels})
    expected, got = by_logit.compute()["ctcvr"], by_probability.compute()["ctcvr"]
    assert got["ne"] == pytest.approx(expected["ne"], rel=1e-9)
    assert got["auc"] == pytest.approx(auc(logits, labels), abs=1e-12) == pytest.approx(expected["auc"])
    assert got["accuracy"] == expected["accuracy"]


def test_scores_of_a_probability_head_are_its_output() -> None:
    p = torch.tensor([0.2, 0.9])
    assert head_scores({"ctcvr": p}, [PROBABILITY])["ctcvr"] is p
    torch.testing.assert_close(head_scores({"ctcvr": p}, [LOGIT])["ctcvr"], torch.sigmoid(p))


def test_only_a_bce_head_reads_a_probability() -> None:
    message = (
        "head 'rating' (x.yaml:9:5): output 'probability' does not fit loss 'mse' "
        "(a bce head's output is 'logit' or 'probability', any other head's 'logit')"
    )
    with pytest.raises(ValueError) as raised:
        HeadConfig("rating", "mse", "stars", output="probability", where="x.yaml:9:5")
    assert str(raised.value) == message


def test_a_probability_head_outside_0_1_names_the_head_and_the_values() -> None:
    head = HeadConfig("ctcvr", "bce", "ctcvr", output="probability", where="x.yaml:12:5")
    with pytest.raises(ValueError) as raised:
        total_loss({"ctcvr": torch.tensor([0.5, 1.25, -0.5])}, {"ctcvr": torch.ones(3)}, [head])
    assert str(raised.value) == (
        "head 'ctcvr' (x.yaml:12:5): output 'probability' holds values outside [0, 1] (min -0.5, max 1.25); "
        "the block it reads must give probabilities"
    )
