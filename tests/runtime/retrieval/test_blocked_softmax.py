"""The blocked in-batch softmax against F.cross_entropy on the whole logit matrix: loss and both gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.cpu import choice
from runtime.retrieval.blocked_softmax import BF16_TOLERANCE, blocked_softmax_loss
from runtime.retrieval.sampled_softmax import sampled_softmax


def _reference(query, candidates, own, hits, temperature, reduction):
    logits = (query / temperature) @ candidates.T
    if hits is not None:
        logits = logits.index_put(hits, torch.tensor(float("-inf"), dtype=logits.dtype))
    return F.cross_entropy(logits, own, reduction=reduction)


# "bounded": unit rows, |logit| <= 1 / T, the bound the loss is told (exp without row maxima); "plain" and
# "large" (logits in the hundreds, past exp's range without row maxima): torch's softmax
CASES = ("bounded", "plain", "large")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("block", [1, 4, 7, 64])
def test_blocked_softmax_matches_cross_entropy_on_the_whole_matrix(block: int, reduction: str, case: str) -> None:
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(13, 8, generator=gen, dtype=torch.float64)
    candidates = torch.randn(17, 8, generator=gen, dtype=torch.float64)
    if case == "bounded":
        query, candidates = F.normalize(query, dim=-1), F.normalize(candidates, dim=-1)
    query = (query * (40.0 if case == "large" else 1.0)).requires_grad_(True)
    candidates.requires_grad_(True)
    own = torch.randint(0, 17, (13,), generator=gen)
    hits = (torch.tensor([0, 0, 5, 12]), torch.tensor([3, 9, 1, 16]))
    weight = 0.7  # an incoming gradient other than 1
    got = blocked_softmax_loss(
        query, candidates, own, hits, 0.3, reduction, block=block, bound=1 / 0.3 if case == "bounded" else None
    )
    (got * weight).backward()
    grads = query.grad.clone(), candidates.grad.clone()
    query.grad = candidates.grad = None
    want = _reference(query, candidates, own, hits, 0.3, reduction)
    (want * weight).backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads, (query.grad, candidates.grad))


def test_rows_whose_own_probability_underflows_keep_their_loss() -> None:
    """float32 losses past 87: the own softmax entry underflows, and the row's loss is taken from its logits."""
    query = torch.tensor([[30.0, 0.0], [0.0, 1.0], [-20.0, 0.5]], requires_grad=True)
    candidates = torch.tensor([[5.0, 0.0], [-5.0, 0.0], [0.0, 1.0]], requires_grad=True)
    own = torch.tensor([1, 2, 0])  # rows 0 and 2: own logits 300 and 200 below the row's largest
    got = blocked_softmax_loss(query, candidates, own, None, 1.0, "sum", block=2)
    got.backward()
    q64, c64 = query.detach().double().requires_grad_(True), candidates.detach().double().requires_grad_(True)
    want = _reference(q64, c64, own, None, 1.0, "sum")
    want.backward()
    assert float(want.detach()) > 450  # the two faint rows dominate
    torch.testing.assert_close(got.double(), want)
    torch.testing.assert_close((query.grad.double(), candidates.grad.double()), (q64.grad, c64.grad))


def test_in_batch_sampled_softmax_takes_the_blocked_path_with_the_same_result() -> None:
    """Next-item training's case: in-batch negatives only, repeated ids (accidental hits), normalised."""
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(40, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    positive = torch.randn(40, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 12, (40,), generator=gen)
    got = sampled_softmax(query, positive, ids, temperature=0.05, normalize=True, reduction="sum")
    got.backward()
    grads = query.grad.clone(), positive.grad.clone()
    query.grad = positive.grad = None
    q, c = F.normalize(query, dim=-1), F.normalize(positive, dim=-1)
    hit = (ids.unsqueeze(1) == ids.unsqueeze(0)).fill_diagonal_(False)
    logits = (q @ c.T / 0.05).masked_fill(hit, float("-inf"))
    want = F.cross_entropy(logits, torch.arange(40), reduction="sum")
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads, (query.grad, positive.grad))


def test_blocked_softmax_without_gradients_returns_the_loss_only() -> None:
    query, candidates = torch.randn(5, 4), torch.randn(5, 4)
    own = torch.arange(5)
    with torch.no_grad():
        got = blocked_softmax_loss(query, candidates, own, None, 1.0, "mean", block=2)
    torch.testing.assert_close(got, F.cross_entropy(query @ candidates.T, own))


@pytest.mark.parametrize("bounded", [False, True])
def test_blocked_softmax_in_float32_at_onednn_sizes(bounded: bool) -> None:
    """Products big enough for oneDNN (runtime.modules.layers.linear.onednn_applies), against float64."""
    gen = torch.Generator().manual_seed(7)
    query = F.normalize(torch.randn(700, 64, generator=gen), dim=-1).requires_grad_(True)
    candidates = F.normalize(torch.randn(650, 64, generator=gen), dim=-1).requires_grad_(True)
    own = torch.randint(0, 650, (700,), generator=gen)
    got = blocked_softmax_loss(query, candidates, own, None, 0.05, "mean", block=256, bound=20.0 if bounded else None)
    got.backward()
    q64, c64 = query.detach().double().requires_grad_(True), candidates.detach().double().requires_grad_(True)
    want = _reference(q64, c64, own, None, 0.05, "mean")
    want.backward()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(query.grad.double(), q64.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(candidates.grad.double(), c64.grad, rtol=1e-4, atol=1e-6)


def test_blocked_softmax_stays_fp32_under_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "softmax_gemm=fp32")
    gen = torch.Generator().manual_seed(9)
    query = F.normalize(torch.randn(300, 64, generator=gen), dim=-1)
    candidates = F.normalize(torch.randn(300, 64, generator=gen), dim=-1)
    own = torch.arange(300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = blocked_softmax_loss(query, candidates, own, None, 0.05, "mean", bound=20.0)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _reference(query, candidates, own, None, 0.05, "mean"))


def _trained_like(gen: torch.Generator, n: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unit queries near their own candidate (own logits close to 1 / T, as after training) and unit candidates
    that repeat (duplicates, as in-batch candidates have)."""
    candidates = F.normalize(torch.randn(n // 2, dim, generator=gen), dim=-1).repeat(2, 1)
    own = torch.randperm(n, generator=gen)
    query = F.normalize(candidates[own] + 0.3 * torch.randn(n, dim, generator=gen), dim=-1)
    return query, candidates, own


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("bounded", [True, False])
@pytest.mark.parametrize("kind", ["random", "trained"])
def test_bf16_products_stay_within_the_stated_tolerance_of_fp32(
    bounded: bool, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced to bf16 under a bf16 autocast: the loss and both gradients against the float64 function."""
    monkeypatch.setenv(choice.ENV, "softmax_gemm=bf16")
    gen = torch.Generator().manual_seed(11)
    n, dim = 600, 64
    if kind == "random":
        query = F.normalize(torch.randn(n, dim, generator=gen), dim=-1)
        candidates = F.normalize(torch.randn(n, dim, generator=gen), dim=-1)
        own = torch.randint(0, n, (n,), generator=gen)
    else:
        query, candidates, own = _trained_like(gen, n, dim)
    hits = (torch.tensor([0, 0, 5, 300]), torch.tensor([3, 9, 1, 16]))
    hits = (hits[0], torch.where(hits[1] == own[hits[0]], hits[1] + 1, hits[1]))
    query.requires_grad_(True)
    candidates.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = blocked_softmax_loss(
            query, candidates, own, hits, 0.05, "mean", block=128, bound=20.0 if bounded else None
        )
    got.backward()
    assert got.dtype == torch.float32
    q64, c64 = query.detach().double().requires_grad_(True), candidates.detach().double().requires_grad_(True)
    want = _reference(q64, c64, own, hits, 0.05, "mean")
    want.backward()
    loss_error = abs(got.item() - want.item()) / abs(want.item())
    assert loss_error <= BF16_TOLERANCE["loss"], loss_error
    assert _relative(query.grad, q64.grad) <= BF16_TOLERANCE["gradient"]
    assert _relative(candidates.grad, c64.grad) <= BF16_TOLERANCE["gradient"]
    assert loss_error > 1e-7  # the bf16 products did run: fp32's error is far below this


def test_bf16_products_are_measured_under_the_callers_bf16_autocast(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No recorded choice (a first run on a machine): the measurement of fp32 against bf16 runs inside
    the caller's autocast, where the fp32 side once came out bf16 and failed ("self and mat2 must have
    the same dtype"); the loss is fp32 whichever way was chosen."""
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice.ENV, raising=False)
    gen = torch.Generator().manual_seed(13)
    query = F.normalize(torch.randn(300, 16, generator=gen), dim=-1)  # at 64 autocast happened to keep fp32
    candidates = F.normalize(torch.randn(300, 16, generator=gen), dim=-1)
    own = torch.arange(300)
    choice.forget_used()
    with choice.run(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = blocked_softmax_loss(query, candidates, own, None, 0.05, "mean", bound=20.0)
    (chosen,) = choice.used()["softmax_gemm"].values()  # measured here: not forced, not read from disk
    assert chosen in ("fp32", "bf16")
    tolerance = 0 if chosen == "fp32" else BF16_TOLERANCE["loss"]
    want = _reference(query.double(), candidates.double(), own, None, 0.05, "mean")
    assert got.dtype == torch.float32 and abs(got.item() - want.item()) <= tolerance * abs(want.item()) + 1e-5


def test_bf16_products_only_under_a_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced to bf16 but outside autocast: the fp32 function, to fp32 rounding."""
    monkeypatch.setenv(choice.ENV, "softmax_gemm=bf16")
    gen = torch.Generator().manual_seed(12)
    query = F.normalize(torch.randn(300, 64, generator=gen), dim=-1)
    candidates = F.normalize(torch.randn(300, 64, generator=gen), dim=-1)
    own = torch.arange(300)
    got = blocked_softmax_loss(query, candidates, own, None, 0.05, "mean", bound=20.0)
    torch.testing.assert_close(got, _reference(query, candidates, own, None, 0.05, "mean"))


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("rows", "columns", "dim", "scale"),
    [(1, 1, 80, 1.0), (37, 50, 16, 3.0), (300, 1000, 64, 0.5), (70, 33, 32, 30.0)],
)
def test_the_native_pass_matches_cross_entropy_in_float64(
    rows: int, columns: int, dim: int, scale: float, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtime/cpu/native/in_batch_softmax.c (forced): rows and columns off its tile sizes, logits in the
    hundreds (scale 30: row maxima needed), accidental hits, a temperature, an incoming gradient."""
    from runtime.cpu import native

    calls = []
    kernel = native.in_batch_softmax
    monkeypatch.setattr(native, "in_batch_softmax", lambda *args: calls.append(1) or kernel(*args))
    monkeypatch.setenv(choice.ENV, "in_batch_softmax=native")
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    gen = torch.Generator().manual_seed(11)
    query = (torch.randn(rows, dim, generator=gen) * scale).requires_grad_(True)
    candidates = torch.randn(columns, dim, generator=gen).requires_grad_(True)
    own = torch.randint(0, columns, (rows,), generator=gen)
    hit_rows = torch.arange(0, rows, 3)
    hit_columns = (own[hit_rows] + 1) % columns
    keep = hit_columns != own[hit_rows]
    hits = (hit_rows[keep], hit_columns[keep])
    got = blocked_softmax_loss(query, candidates, own, hits, 0.7, "sum")
    (got * 0.6).backward()
    assert calls == [1]
    q64, c64 = query.detach().double().requires_grad_(True), candidates.detach().double().requires_grad_(True)
    want = _reference(q64, c64, own, hits, 0.7, "sum")
    (want * 0.6).backward()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    for grad, exact in ((query.grad, q64.grad), (candidates.grad, c64.grad)):  # float32 logits in the hundreds
        torch.testing.assert_close(grad.double(), exact, rtol=1e-4, atol=5e-5 * float(exact.abs().max()))
    with torch.no_grad():  # the loss alone
        alone = blocked_softmax_loss(query, candidates, own, hits, 0.7, "mean")
    torch.testing.assert_close(alone.double(), want / rows, rtol=1e-5, atol=1e-5)
