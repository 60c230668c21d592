"""`dense_optimizer.step`: the dense step on one thread or on torch's team (kernel 'dense_step')
updates exactly as `optimizer.step()`, measuring leaves the real parameters alone, and the
thread count comes back whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.config.training import DenseOptimizerConfig
from runtime.cpu import choice
from runtime.train.dense_optimizer import make_dense_optimizer, step, twin_of

CONFIGS = [
    DenseOptimizerConfig("sgd", lr=0.1, weight_decay=0.01),
    DenseOptimizerConfig("adagrad", lr=0.01, eps=1e-8),
    DenseOptimizerConfig("adam", lr=0.01),
    DenseOptimizerConfig("adamw", lr=0.01, weight_decay=0.1),
]
SHAPES = [(300, 70), (300,), (5, 300), (5,), (1,)]  # a parameter with no gradient is added below


@pytest.fixture(autouse=True)
def two_threads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Two intra-op threads, where the choice is asked; an empty choice cache of the test's own."""
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice.ENV, raising=False)
    choice.forget_used()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _train(config: DenseOptimizerConfig, stepper: str) -> list[torch.Tensor]:
    """Parameters and optimizer state after three steps stepped by `stepper` ('plain' or 'ours')."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in SHAPES]
    frozen = torch.nn.Parameter(torch.randn(4, generator=gen))  # never gets a gradient
    optimizer = make_dense_optimizer(config, [*params, frozen])
    for index in range(3):
        grads = torch.Generator().manual_seed(index + 1)
        for p in params:
            p.grad = torch.randn(p.shape, generator=grads)
        optimizer.step() if stepper == "plain" else step(optimizer)
        assert torch.get_num_threads() == 2
    state = [t for p in params for t in optimizer.state[p].values() if isinstance(t, torch.Tensor)]
    return [*(p.detach() for p in params), frozen.detach(), *state]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.type)
@pytest.mark.parametrize("path", ["team", "one", None])
def test_every_way_updates_exactly_as_optimizer_step(
    config: DenseOptimizerConfig, path: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced either way, or measured on the empty cache at the first step (on a twin of copies)."""
    expected = _train(config, "plain")
    if path is not None:
        monkeypatch.setenv(choice.ENV, f"dense_step={path}")
    got = _train(config, "ours")
    for ours, plain in zip(got, expected, strict=True):
        assert torch.equal(ours, plain)
    if path is None:
        (measured,) = [c for c in choice.recorded() if c.kernel == "dense_step"] or [None]
        used = choice.used()["dense_step"]
        assert list(used) == [f"{config.type}_tensors5_values{choice.bucket(300 * 70 + 300 + 5 * 300 + 5 + 1)}_t2"]
        assert measured is None or measured.winner == next(iter(used.values()))


def test_the_threads_come_back_when_the_step_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "dense_step=one")
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = make_dense_optimizer(DenseOptimizerConfig("adagrad", lr=0.01), [param])
    param.grad = torch.zeros(3)
    seen = []

    def fails() -> None:
        seen.append(torch.get_num_threads())
        raise RuntimeError("the step failed")

    monkeypatch.setattr(optimizer, "step", fails)
    with pytest.raises(RuntimeError, match=r"^the step failed$"):
        step(optimizer)
    assert seen == [1]
    assert torch.get_num_threads() == 2


def test_one_thread_asks_nothing() -> None:
    torch.set_num_threads(1)
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = make_dense_optimizer(DenseOptimizerConfig("sgd", lr=0.5), [param])
    param.grad = torch.ones(3)
    step(optimizer)
    assert torch.equal(param.detach(), torch.full((3,), 0.5))
    assert "dense_step" not in choice.used()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.type)
def test_a_twin_steps_as_the_optimizer_would_and_leaves_it_alone(config: DenseOptimizerConfig) -> None:
    """What the choice times: a real step of copies, not a step with no gradients."""
    params = [torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(3))) for shape in SHAPES]
    optimizer = make_dense_optimizer(config, params)
    for p in params:
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(4))

    def snapshot() -> list[torch.Tensor]:
        state = [t for p in params for t in optimizer.state[p].values() if isinstance(t, torch.Tensor)]
        return [t.detach().clone() for t in [*params, *state]]

    before = snapshot()
    twin = twin_of(optimizer)
    twin.step()
    assert all(torch.equal(now, then) for now, then in zip(snapshot(), before, strict=True))
    optimizer.step()
    stepped = [p for group in twin.param_groups for p in group["params"]]
    for ours, theirs in zip(stepped, params, strict=True):
        assert ours is not theirs
        assert torch.equal(ours.detach(), theirs.detach())
