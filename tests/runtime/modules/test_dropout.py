"""Tests for runtime/modules/layers/dropout.py at world size 1; the two-rank checks are in test_sync_blocks.py."""

from __future__ import annotations

import pytest
import torch

from runtime.modules.layers.dropout import KeyedDropout, derive_seed, keep_mask


def test_keep_rate_and_independence_over_a_large_mask() -> None:
    mask = keep_mask(0.3, seed=5, stream=0, step=0, samples=torch.arange(4096), width=256).double()
    # 1M Bernoulli(0.7) draws: the mean is within 5 standard deviations (5 * 4.6e-4) of 0.7.
    assert abs(mask.mean().item() - 0.7) < 2.3e-3
    # Neighbouring columns and rows are uncorrelated (covariance within 5 standard deviations, 5 * 2.1e-4).
    centred = mask - 0.7
    assert abs((centred[:, 1:] * centred[:, :-1]).mean().item()) < 1.05e-3
    assert abs((centred[1:] * centred[:-1]).mean().item()) < 1.05e-3


def test_each_key_changes_the_mask() -> None:
    samples = torch.arange(64)
    base = keep_mask(0.5, 1, 0, 0, samples, 32)
    for other in (
        keep_mask(0.5, 2, 0, 0, samples, 32),
        keep_mask(0.5, 1, 1, 0, samples, 32),
        keep_mask(0.5, 1, 0, 1, samples, 32),
        keep_mask(0.5, 1, 0, 0, samples + 64, 32),
    ):
        assert 0.35 < (base != other).double().mean().item() < 0.65


def test_a_sample_mask_depends_only_on_its_global_index() -> None:
    whole = keep_mask(0.4, 3, 2, 7, torch.arange(10), 6)
    torch.testing.assert_close(keep_mask(0.4, 3, 2, 7, torch.arange(4, 10), 6), whole[4:], rtol=0, atol=0)


def test_forward_scales_kept_elements_and_counts_steps() -> None:
    drop = KeyedDropout(0.25, seed=9, stream=1, first_sample=3)
    x = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    for step in range(2):
        out = drop(x)
        mask = keep_mask(0.25, 9, 1, step, torch.arange(3, 8), 8).view(5, 2, 4)
        torch.testing.assert_close(out, torch.where(mask, x / 0.75, torch.zeros_like(x)), rtol=1e-12, atol=1e-12)
    assert int(drop.step) == 2 and "step" in drop.state_dict()
    out.sum().backward()
    torch.testing.assert_close(x.grad, mask.double() / 0.75, rtol=1e-12, atol=1e-12)


def test_identity_in_eval_and_at_zero() -> None:
    x = torch.randn(3, 4)
    drop = KeyedDropout(0.5).eval()
    assert drop(x) is x and int(drop.step) == 0
    assert KeyedDropout(0.0)(x) is x


def test_derived_seeds_differ() -> None:
    assert len({derive_seed(0, i) for i in range(100)} | {derive_seed(1, i) for i in range(100)}) == 200


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"p": 1.0}, "KeyedDropout: p must be a number in [0, 1) (got 1.0)"),
        ({"p": "0.1"}, "KeyedDropout: p must be a number in [0, 1) (got '0.1')"),
        ({"p": 0.1, "seed": -1}, "KeyedDropout: seed must be an integer >= 0 (got -1)"),
        ({"p": 0.1, "stream": 1.5}, "KeyedDropout: stream must be an integer >= 0 (got 1.5)"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        KeyedDropout(**kwargs)
    assert str(err.value) == message
