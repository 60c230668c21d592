"""Tests for runtime/cpu/native: the C dot-interaction kernel against a float64 reference.

The reference is the formula itself (bmm over the concatenated vectors in
float64, then the strict upper triangle); the kernel reads its inputs in
parts, so the tests split the vectors in several ways, with widths that take
the vectorised kernels (16, 64, 128) and the generic one (3, 24).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from runtime.cpu import choice, native
from runtime.modules.blocks.pooled import DotInteraction

REPO = Path(__file__).resolve().parents[3]
F32 = {"rtol": 2e-5, "atol": 2e-5}

pytestmark = pytest.mark.usefixtures("native_kernels")


@pytest.fixture(autouse=True)
def _native_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C kernel whatever the calibration would choose: these tests are about it."""
    monkeypatch.setenv(choice.ENV, "dot=native")


def _reference(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    x = torch.cat(parts, dim=1).double()
    n = x.shape[1] // dim
    z = x.view(x.shape[0], n, dim)
    rows, cols = torch.triu_indices(n, n, 1)
    return torch.cat([x[:, :dim], torch.bmm(z, z.transpose(1, 2))[:, rows, cols]], dim=1)


def _split(batch: int, dim: int, counts: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, k * dim, generator=gen).requires_grad_() for k in counts]


@pytest.mark.parametrize(
    ("dim", "counts", "batch"),
    [
        (64, [1, 26], 300),
        (64, [27], 5),
        (16, [1, 3, 2], 17),
        (32, [1, 8], 5),
        (128, [2, 2], 3),
        (3, [1, 4], 9),
        (24, [1, 1], 1),
    ],
)
def test_forward_and_backward_match_the_float64_formula(dim: int, counts: list[int], batch: int) -> None:
    parts = _split(batch, dim, counts, seed=dim + batch)
    block = DotInteraction(sum(counts), dim)
    out = block(*parts)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    out.backward(grad)

    ref_parts = [p.detach().double().requires_grad_() for p in parts]
    ref = _reference(ref_parts, dim)
    ref.backward(grad.double())

    torch.testing.assert_close(out.double(), ref.detach(), **F32)
    for part, ref_part in zip(parts, ref_parts):
        torch.testing.assert_close(part.grad.double(), ref_part.grad, **F32)


def test_native_and_torch_paths_agree_and_threads_do_not_change_results() -> None:
    parts = [p.detach() for p in _split(64, 8, [1, 5], seed=3)]
    block = DotInteraction(6, 8)
    native_out = block(*parts)
    torch_out = block(torch.cat(parts, dim=1).double()).float()  # float64 takes the torch path
    torch.testing.assert_close(native_out, torch_out, **F32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = block(*parts)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, native_out)  # each sample is computed by one thread, whatever their number


def test_only_inputs_that_need_gradients_get_them_and_an_empty_batch_works() -> None:
    bottom, emb = _split(4, 16, [1, 2], seed=1)
    bottom.requires_grad_(False)
    DotInteraction(3, 16)(bottom, emb).sum().backward()
    assert bottom.grad is None and emb.grad is not None
    empty = DotInteraction(3, 16)(torch.zeros(0, 16), torch.zeros(0, 32))
    assert empty.shape == (0, 16 + 3)


def test_several_inputs_are_checked_against_the_block_shape() -> None:
    block = DotInteraction(3, 4)
    with pytest.raises(ValueError) as err:
        block(torch.zeros(2, 4), torch.zeros(2, 6))
    assert str(err.value) == (
        "DotInteraction: expected inputs of shapes (B, k_i * 4) with sum k_i = 3, got [(2, 4), (2, 6)]"
    )
    with pytest.raises(ValueError):
        block(torch.zeros(2, 4), torch.zeros(3, 8))


def test_library_is_cached_and_a_missing_compiler_falls_back_to_torch_with_a_warning(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import warnings, torch
        from runtime.cpu import choice, native
        from runtime.modules.blocks.pooled import DotInteraction
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.library() is None
        print(caught[0].message)
        torch.manual_seed(0)
        x = torch.randn(3, 8)
        print(torch.allclose(DotInteraction(4, 2)(x), DotInteraction(4, 2)(x.double()).float(), atol=1e-6))
    """)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "CC": "/nonexistent/cc",
        "RECCOMPILE_CACHE_DIR": str(tmp_path),
    }
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "reccompile: native kernels unavailable, using torch ops instead: "
        "no C compiler: '/nonexistent/cc' is not on PATH (set CC to one)",
        "True",
    ]
    assert native.library() is native.library()
    assert list(native.cache_dir().glob("kernels-*.so"))


def test_backward_reads_a_gradient_whose_rows_are_further_apart_than_its_width() -> None:
    parts = [p.detach() for p in _split(33, 64, [1, 26], seed=11)]
    width = 64 + 27 * 26 // 2
    wide = torch.randn(33, width + 1, generator=torch.Generator().manual_seed(12))
    sliced = wide[:, :width]  # the (B, 415) view runtime/modules/layers/padded_grad.py returns
    assert not sliced.is_contiguous()
    for strided, packed in zip(
        native.dot_backward(parts, 64, sliced), native.dot_backward(parts, 64, sliced.contiguous())
    ):
        assert torch.equal(strided, packed)


def test_parts_that_are_column_slices_of_one_buffer_are_read_and_their_gradients_written_in_place() -> None:
    """The pieces of a pooled all-to-all's receive buffer: each a (B, k * dim) slice of a wider
    block, rows further apart than their width. Same bits as the same vectors made contiguous."""
    batch, dim = 7, 16
    gen = torch.Generator().manual_seed(5)
    buffer = torch.randn(batch * 7 * dim, generator=gen)

    def pieces(flat: torch.Tensor) -> list[torch.Tensor]:  # two blocks, 5 and 2 vectors wide, interleaved
        first, second = flat[: batch * 5 * dim].view(batch, 5 * dim), flat[batch * 5 * dim :].view(batch, 2 * dim)
        return [second[:, dim:], first[:, : 3 * dim], second[:, :dim], first[:, 3 * dim :]]

    parts = [torch.randn(batch, dim, generator=gen), *pieces(buffer)]
    assert [p.is_contiguous() for p in parts] == [True, False, False, False, False]
    packed = [p.contiguous() for p in parts]
    assert torch.equal(native.dot_forward(parts, dim), native.dot_forward(packed, dim))

    grad_out = torch.randn(batch, dim + 8 * 7 // 2, generator=gen)
    grad_buffer = torch.full_like(buffer, float("nan"))
    into = [torch.empty(batch, dim), *pieces(grad_buffer)]
    written = native.dot_backward(parts, dim, grad_out, into)
    expected = native.dot_backward(packed, dim, grad_out)
    assert all(w is i for w, i in zip(written, into))
    for got, want in zip(into, expected):
        assert torch.equal(got, want)
    assert not grad_buffer.isnan().any()  # every element of the buffer was written
