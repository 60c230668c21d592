"""Tests for runtime/modules/layers/sync_norm.py at world size 1: SyncBatchNorm against torch's nn.BatchNorm1d.

Outputs, input and parameter gradients and running statistics over three
training steps and in eval mode, in float32 to 1e-5. The two-rank checks
are in test_sync_blocks.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime.modules.layers.sync_norm import SyncBatchNorm

F32 = {"rtol": 1e-5, "atol": 1e-5}


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3 + 2


@pytest.mark.parametrize("shape", [(16, 5), (6, 4, 5)])
def test_trains_and_evaluates_like_nn_batchnorm1d(shape: tuple[int, ...]) -> None:
    ours, theirs = SyncBatchNorm(5, momentum=0.2), nn.BatchNorm1d(5, momentum=0.2)
    with torch.no_grad():
        ours.weight.copy_(torch.linspace(0.5, 1.5, 5))
        ours.bias.copy_(torch.linspace(-1, 1, 5))
    theirs.load_state_dict(ours.state_dict())
    for step in range(3):
        x = _randn(*shape, seed=step)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = ours(a)
        # BatchNorm1d normalises (B, C, L) over B and L: channels in dim 1.
        expected = theirs(b) if len(shape) == 2 else theirs(b.transpose(1, 2)).transpose(1, 2)
        torch.testing.assert_close(out, expected, **F32)
        weights = _randn(*shape, seed=10 + step)
        (out * weights).sum().backward()
        (expected * weights).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, **F32)
        for name in ("weight", "bias"):
            torch.testing.assert_close(getattr(ours, name).grad, getattr(theirs, name).grad, **F32)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), **F32)
    ours.eval(), theirs.eval()
    x = _randn(*shape, seed=99)
    expected = theirs(x) if len(shape) == 2 else theirs(x.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(ours(x), expected, **F32)


def test_a_channel_whose_mean_dwarfs_its_spread_keeps_its_variance() -> None:
    """Mean 1000, std 0.01: float32 squares of such values lose the variance in E[x^2] - E[x]^2.
    The reference is nn.BatchNorm1d in float64 on the same float32 values (torch's own float32
    BatchNorm is off by 1.9e-2 here)."""
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0)) * 0.01 + 1000
    ours, exact = SyncBatchNorm(4, momentum=1.0), nn.BatchNorm1d(4, momentum=1.0).double()
    torch.testing.assert_close(ours(x).double(), exact(x.double()), rtol=0, atol=5e-3)
    torch.testing.assert_close(ours.running_var.double(), x.double().var(0), rtol=1e-5, atol=0)


def test_state_dict_has_nn_batchnorm1d_keys() -> None:
    assert list(SyncBatchNorm(3).state_dict()) == list(nn.BatchNorm1d(3).state_dict())


def test_a_global_batch_of_one_sample_is_an_error() -> None:
    with pytest.raises(ValueError) as err:
        SyncBatchNorm(3, where="specs/n.yaml:2:3")(torch.zeros(1, 3))
    assert str(err.value) == (
        "SyncBatchNorm (specs/n.yaml:2:3): training needs more than 1 value per channel, got 1 in the global batch"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_features": 0}, "SyncBatchNorm: num_features must be an integer >= 1 (got 0)"),
        ({"num_features": 3, "eps": 0}, "SyncBatchNorm: eps must be a number > 0 (got 0)"),
        ({"num_features": 3, "momentum": 1.5}, "SyncBatchNorm: momentum must be a number in [0, 1] (got 1.5)"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        SyncBatchNorm(**kwargs)
    assert str(err.value) == message


def test_rejects_inputs_of_other_widths() -> None:
    with pytest.raises(ValueError) as err:
        SyncBatchNorm(3)(torch.zeros(4, 2))
    assert str(err.value) == "SyncBatchNorm: expected input of shape (B, 3) or (B, N, 3), got (4, 2)"
