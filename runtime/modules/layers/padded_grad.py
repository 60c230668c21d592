"""A linear layer whose input gradient is computed on a weight padded to a multiple of 8 columns.

The input gradient of y = x W^T + b is g W, a (B, in) matrix. When `in` is
not a multiple of 8 floats (32 bytes, an AVX2 register), MKL writes every
output row unaligned and runs that GEMM markedly slower: dlrm-bench's top
layer (415 -> 512, batch 2048) takes 15.5 ms for g W against 12.3 ms for g
times W padded with zero columns to 416, slicing the 415 columns back out
(1 thread, CPU time, AMD EPYC 7002 / AVX2). Not every shape gains (100 ->
256 loses a little), so the first call at each shape times both
(runtime/cpu/choice.py, kernel 'linear_grad_input'). The padded columns
are zero, so the result is the same GEMM's sums, up to float32 rounding.

The weight gradient has the same trouble the other way round. Autograd forms
it as g^T x, a GEMM that writes rows of `in` floats, unaligned for such an
`in`; (x^T g)^T writes rows of `out` floats instead and reads the same
operands: dlrm-bench's input layer (13 -> 512, batch 2048) takes 1.37 ms for
g^T x against 0.43 ms for x^T g (1 thread, CPU time, AMD EPYC Zen 4), and
415 -> 512 gains ~9% too. The backward below forms it so for every such
layer, including an input layer whose x needs no gradient (dense features),
which then skips g W altogether.

`padded_linear` is the layer as one autograd function: the same forward as
F.linear (+ ReLU in place), and a backward that differs from autograd's only
in how it forms g W and g^T x. It runs where `applies`: a 2-D float32 CPU
input with `in` not a multiple of 8, in a layer whose weight needs its gradient
or whose input does.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from runtime.cpu import choice

__all__ = ["ALIGN", "applies", "input_grad", "padded_linear"]

ALIGN = 8  # floats


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `padded_linear` may run this layer (see the module docstring)."""
    return (
        (x.requires_grad or weight.requires_grad)
        and x.dim() == 2
        and x.shape[0] > 0
        and weight.shape[1] % ALIGN != 0
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
    )


def _padded(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    out_features, in_features = weight.shape
    wide = weight.new_zeros(out_features, -(-in_features // ALIGN) * ALIGN)
    wide[:, :in_features] = weight
    return grad.mm(wide)[:, :in_features]


def _choose(grad: torch.Tensor, weight: torch.Tensor) -> str:
    shape = f"b{choice.bucket(grad.shape[0])}_in{weight.shape[1]}_out{weight.shape[0]}_t{torch.get_num_threads()}"

    @functools.cache  # copied only if a measurement runs
    def copies() -> tuple[torch.Tensor, torch.Tensor]:
        return grad.detach().clone(), weight.detach().clone()

    def plain() -> object:
        g, w = copies()
        return g.mm(w)

    site = f"in{weight.shape[1]}_out{weight.shape[0]}"  # the layer: no batch, no thread count
    return choice.choose("linear_grad_input", shape, {"plain": plain, "padded": lambda: _padded(*copies())}, site=site)


def input_grad(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """g W, on the padded weight where that measured faster at these shapes (a (B, in) view then)."""
    if _choose(grad, weight) == "padded":
        return _padded(grad, weight)
    return grad.mm(weight)


class _PaddedLinear(torch.autograd.Function):
    """act(x W^T + b); backward as autograd's, with g W from `input_grad`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool
    ) -> torch.Tensor:
        out = torch.addmm(bias, x, weight.t()) if bias is not None else torch.mm(x, weight.t())
        if relu:
            out.relu_()
        ctx.relu = relu
        ctx.save_for_backward(x, weight, out if relu else None)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, out = ctx.saved_tensors
        if ctx.relu:
            grad = torch.ops.aten.threshold_backward(grad, out, 0)
        needs_x, needs_weight, needs_bias, _ = ctx.needs_input_grad
        grad_x = input_grad(grad, weight) if needs_x else None
        # x^T g then transposed, not autograd's g^T x: this GEMM writes rows of out_features floats.
        grad_weight = x.t().mm(grad).t() if needs_weight else None
        grad_bias = grad.sum(0) if needs_bias else None
        return grad_x, grad_weight, grad_bias, None


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
    """F.linear(x, weight, bias), then ReLU if `relu`, as `_PaddedLinear` (where `applies`)."""
    return _PaddedLinear.apply(x, weight, bias, relu)
