"""Tests for runtime/modules/layers/one_query_attention.py: both paths against the formula in float64.

The reference attends sample by sample over x[b, :counts[b]] in float64;
the padding after counts[b] holds noise, so a path that read it would
differ. Values and the gradients of x and the queries agree to 2e-5.
"""

from __future__ import annotations

import pytest
import torch

from runtime.cpu import choice
from runtime.modules.layers.one_query_attention import one_query_attention

TOL = {"rtol": 2e-5, "atol": 2e-5}


def reference(x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    out = []
    for b, n in enumerate(counts.tolist()):
        keys = x[b, :n].double()  # [n, D]
        probs = torch.softmax(query[b].double() @ keys.T, dim=1)  # [heads, n]
        out.append(probs @ keys)
    return torch.stack(out).float()


def inputs(batch: int, length: int, heads: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, length, dim, generator=gen)
    query = torch.randn(batch, heads, dim, generator=gen) * 0.3
    counts = torch.randint(1, length + 1, (batch,), generator=gen)
    counts[0], counts[-1] = 1, length
    return x, query, counts


@pytest.mark.parametrize("path", ["torch", "native"])
@pytest.mark.parametrize(("batch", "length", "heads", "dim"), [(7, 6, 2, 8), (33, 51, 2, 64), (5, 3, 1, 13)])
def test_both_paths_equal_the_formula_with_gradients(
    path: str,
    batch: int,
    length: int,
    heads: int,
    dim: int,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    if path == "native":
        request.getfixturevalue("native_kernels")
    monkeypatch.setenv(choice.ENV, f"attention={path}")
    x, query, counts = inputs(batch, length, heads, dim)
    x_ref, query_ref = x.clone().requires_grad_(), query.clone().requires_grad_()
    x.requires_grad_(), query.requires_grad_()

    out = one_query_attention(x, query, counts)
    expected = reference(x_ref, query_ref, counts)
    torch.testing.assert_close(out, expected, **TOL)
    with torch.no_grad():
        torch.testing.assert_close(one_query_attention(x, query, counts), expected, **TOL)

    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
    torch.testing.assert_close(query.grad, query_ref.grad, **TOL)
    padding = torch.arange(length).unsqueeze(0) >= counts.unsqueeze(1)
    assert x.grad[padding].abs().sum() == 0


@pytest.mark.usefixtures("native_kernels")
def test_a_padded_length_past_a_threads_stack_runs_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C kernel kept a row of `length` floats on each thread's stack: 2.5M of them overflowed it
    (SIGSEGV). Short counts keep the float32 sums comparable with the reference."""
    monkeypatch.setenv(choice.ENV, "attention=native")
    x, query, _ = inputs(2, 2_500_000, 1, 2)
    counts = torch.tensor([3, 100])
    x_ref, query_ref = x.clone().requires_grad_(), query.clone().requires_grad_()
    x.requires_grad_(), query.requires_grad_()
    out, expected = one_query_attention(x, query, counts), reference(x_ref, query_ref, counts)
    torch.testing.assert_close(out, expected, **TOL)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
    torch.testing.assert_close(query.grad, query_ref.grad, **TOL)


@pytest.mark.usefixtures("native_kernels")
def test_the_choice_is_measured_once_per_shape(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(choice.ENV, raising=False)
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    choice._read.cache_clear()
    x, query, counts = inputs(8, 6, 2, 8)
    one_query_attention(x, query, counts)
    made = [c for c in choice.recorded() if c.kernel == "attention"]
    assert [(c.shape, sorted(dict(c.times_ms))) for c in made] == [
        ("b8_l6_h2_d8_fwd_t%d" % torch.get_num_threads(), ["native", "torch"])
    ]
