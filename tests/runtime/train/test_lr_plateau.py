"""LrPlateau against torch.optim.lr_scheduler.ReduceLROnPlateau fed the same metric sequences."""

from __future__ import annotations

import pytest
import torch

from runtime.train.early_stopping import BestMetric
from runtime.train.lr_plateau import LrPlateau

SEQUENCES = {
    "rising_then_flat": [0.70, 0.75, 0.75, 0.74, 0.76, 0.76, 0.76, 0.76, 0.77, 0.70],
    "within_threshold": [0.5, 0.50001, 0.50002, 0.6, 0.6, 0.6, 0.6, 0.6],
    "undefined_first": [None, 0.6, 0.59, 0.61, 0.58, 0.57, 0.56, 0.55, 0.54],
}


def _torch_scales(values: list[float | None], mode: str, factor: float, patience: int, min_lr: float) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode=mode, factor=factor, patience=patience, min_lr=min_lr, threshold=1e-4
    )
    scales = []
    for value in values:
        # torch has no undefined metric: one that can never be a gain stands for it
        scheduler.step(float("-inf") if value is None and mode == "max" else float("inf") if value is None else value)
        scales.append(optimizer.param_groups[0]["lr"])
    return scales


@pytest.mark.parametrize("name", sorted(SEQUENCES))
@pytest.mark.parametrize(("metric", "patience", "min_factor"), [("auc", 1, 0.0), ("auc", 0, 0.005), ("ne", 2, 0.0)])
def test_decisions_match_torch(name: str, metric: str, patience: int, min_factor: float) -> None:
    values = SEQUENCES[name]
    if metric == "ne":  # lower is better: the same sequence mirrored
        values = [None if v is None else 1.0 - v for v in values]
    plateau = LrPlateau(BestMetric("click", metric), factor=0.1, patience=patience, min_factor=min_factor)
    ours = [plateau.observe({"click": {metric: v}}) for v in values]
    mode = "min" if metric == "ne" else "max"
    assert ours == pytest.approx(_torch_scales(values, mode, 0.1, patience, min_factor), rel=1e-12)


def test_explicit_mode_overrides_the_metric() -> None:
    plateau = LrPlateau(BestMetric("click", "auc"), factor=0.5, patience=0, higher_is_better=False)
    assert [plateau.observe({"click": {"auc": v}}) for v in (0.5, 0.4, 0.6)] == [1.0, 1.0, 0.5]


def test_resumed_state_goes_on_as_the_uninterrupted_run() -> None:
    values = SEQUENCES["rising_then_flat"]
    whole = LrPlateau(BestMetric("click", "auc"), patience=1)
    expected = [whole.observe({"click": {"auc": v}}) for v in values]
    first = LrPlateau(BestMetric("click", "auc"), patience=1)
    seen = [first.observe({"click": {"auc": v}}) for v in values[:5]]
    resumed = LrPlateau(BestMetric("click", "auc"), patience=1)
    assert resumed.load_state_dict(first.state_dict())
    seen += [resumed.observe({"click": {"auc": v}}) for v in values[5:]]
    assert seen == expected
    assert not LrPlateau(BestMetric("click", "ne")).load_state_dict(first.state_dict())


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError) as error:
        LrPlateau(BestMetric("click", "auc"), factor=1.0)
    assert str(error.value) == "lr plateau: factor must be between 0 and 1 (exclusive), got 1.0"
