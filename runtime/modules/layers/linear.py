"""Linear layers whose float32 CPU GEMMs run on oneDNN.

PyTorch sends float32 `addmm`/`mm` on the CPU to MKL, and MKL takes a
generic (AVX2) code path on x86 CPUs that are not Intel's, such as the AMD
EPYC machines this project is measured on. oneDNN chooses its kernels by
instruction set instead, and runs the same GEMMs 2-2.7x faster there
(benchmarks/blocks_bench.py, the `mlp_*` lines). `linear` sends the three
GEMMs of a layer to oneDNN: the forward through
`torch.ops.mkldnn._linear_pointwise` (the op inductor emits for its own CPU
linears) with a following ReLU fused, the input gradient through the same
op, and the weight and bias gradients through oneDNN's inner-product
backward or torch's mm, whichever measured faster (`_weight_grad`). Results are
float32 GEMMs with another summation order: equal to `F.linear` up to
rounding.

Where oneDNN applies, the first call at each layer shape times both
(runtime/cpu/choice.py, kernel 'linear') and the faster runs from then on:
oneDNN's lead depends on the CPU and its BLAS. Everywhere else (CUDA, meta tensors for shape propagation, other dtypes, a
build without oneDNN, products too small to pay oneDNN's per-call weight
reorder, such as serving a single sample) it is `F.linear`. torch.export
turns oneDNN off while it traces, so exported programs hold the portable
`aten.linear` and agree with the eager model up to float32 rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from runtime.cpu import choice
from runtime.modules.layers import padded_grad

__all__ = ["MIN_ONEDNN_MACS", "Linear", "linear", "onednn_applies", "onednn_chosen"]

# oneDNN's call reorders the plain weight each time, 20-30 us here, so below about
# this many multiply-adds (batch x in x out) MKL is faster: measured at 2 threads on
# dlrm-bench's layers, oneDNN wins from batch 4 at 415x512, 16 at 512x256, 256 at 13x512.
MIN_ONEDNN_MACS = 1 << 21


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "relu" if relu else "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """y = act(x W^T + b); backward: dx = g W on oneDNN, dW = g^T x and db = sum_rows(g) by `_weight_grad`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool
    ) -> torch.Tensor:
        out = _onednn_linear(x, weight, bias, relu)
        ctx.relu = relu
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, out if relu else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, out = ctx.saved_tensors
        grad = grad.contiguous()
        if ctx.relu:
            grad = torch.ops.aten.threshold_backward(grad, out, 0)
        needs_x, needs_weight, needs_bias, _ = ctx.needs_input_grad
        grad_x = _onednn_linear(grad, weight.t(), None, False) if needs_x else None
        grad_weight = grad_bias = None
        if needs_weight:
            grad_weight, grad_bias = _weight_grad(grad, x, weight, ctx.has_bias)
        elif ctx.has_bias and needs_bias:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias if needs_bias else None, None


def _weight_grad_mm(grad: torch.Tensor, x: torch.Tensor, has_bias: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    # g^T x where `in` is a multiple of 8 floats: the weight's own layout, which autograd then keeps
    # (a transposed view it would copy). Else (x^T g)^T, which writes aligned rows of `out` floats
    # (runtime/modules/layers/padded_grad.py); 13 -> 512 and 415 -> 512 gain, the copy is small.
    grad_weight = grad.t().mm(x) if x.shape[1] % padded_grad.ALIGN == 0 else x.t().mm(grad).t()
    return grad_weight, grad.sum(0) if has_bias else None


def _weight_grad_onednn(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # oneDNN's inner-product backward reads g and x as stored and sums the bias gradient in the
    # same pass, but on oneDNN's own tensors: g, x and the weight are copied in first.
    grad_weight, grad_bias = torch.ops.aten.mkldnn_linear_backward_weights(
        grad.to_mkldnn(), x.contiguous().to_mkldnn(), weight.to_mkldnn(), has_bias
    )
    return grad_weight.to_dense(), grad_bias.to_dense() if has_bias else None


def _weight_grad(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dW = g^T x and db = sum_rows(g): on torch's mm or on oneDNN's inner-product backward,
    whichever measured faster at this layer's shapes (runtime/cpu/choice.py, kernel
    'linear_grad_weight').

    oneDNN runs the forward and the input gradient faster than MKL on this project's AMD
    CPUs, but not always the weight gradient, whose inputs it must copy into its own layout:
    on the 2-core Zen 4, 1 thread, CPU time, the 512 -> 256 layer's weight gradient took
    5.73 ms on mm against 5.90 ms on oneDNN, and 415 -> 512's 9.34 against 9.86 ms."""
    shape = (
        f"b{choice.bucket(grad.shape[0])}_in{weight.shape[1]}_out{weight.shape[0]}{'_bias' if has_bias else ''}"
        f"_t{torch.get_num_threads()}"
    )
    runs = {
        "mm": lambda: _weight_grad_mm(grad, x, has_bias),
        "onednn": lambda: _weight_grad_onednn(grad, x, weight, has_bias),
    }
    site = shape[shape.index("_") + 1 : shape.rindex("_t")]  # the layer: no batch, no thread count
    if choice.choose("linear_grad_weight", shape, runs, site=site) == "onednn":
        return _weight_grad_onednn(grad, x, weight, has_bias)
    return _weight_grad_mm(grad, x, has_bias)


def onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs this product on oneDNN (see the module docstring)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() == 2
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled  # off while torch.export traces: no guard on the batch below
        and x.shape[0] * weight.shape[0] * weight.shape[1] >= MIN_ONEDNN_MACS
    )


def _aten(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool, grad: bool) -> torch.Tensor:
    if grad and padded_grad.applies(x, weight):
        return padded_grad.padded_linear(x, weight, bias, relu)
    out = F.linear(x, weight, bias)
    return torch.relu_(out) if relu else out


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool, grad: bool) -> torch.Tensor:
    return _OneDNNLinear.apply(x, weight, bias, relu) if grad else _onednn_linear(x, weight, bias, relu)


def _choose(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool, grad: bool) -> str:
    """'onednn' or 'aten' for this layer's shapes, timed on copies (all three GEMMs if `grad`)."""
    shape = (
        f"b{choice.bucket(x.shape[0])}_in{weight.shape[1]}_out{weight.shape[0]}{'_bias' if bias is not None else ''}"
        f"{'_relu' if relu else ''}_{'fwdbwd' if grad else 'fwd'}_t{torch.get_num_threads()}"
    )

    @functools.cache  # copied only if a measurement runs
    def copies() -> list[torch.Tensor]:
        return [t.detach().clone().requires_grad_(grad) for t in (x, weight, bias) if t is not None]

    def timed(path: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            with torch.enable_grad() if grad else torch.no_grad():
                inputs = copies()
                out = path(inputs[0], inputs[1], inputs[2] if bias is not None else None, relu, grad)
                return torch.autograd.grad(out, inputs, torch.ones_like(out)) if grad else out

        return run

    site = shape[shape.index("_") + 1 : shape.rindex("_t")]  # the layer: no batch, no thread count
    return choice.choose("linear", shape, {"aten": timed(_aten), "onednn": timed(_onednn)}, site=site)


def onednn_chosen(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> bool:
    """Whether `linear` runs this forward-only product on oneDNN (runtime/serving/packed_mlp.py asks)."""
    return onednn_applies(x, weight) and _choose(x, weight, bias, relu, False) == "onednn"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, relu: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias), then ReLU if `relu`; on oneDNN where it applies and is the faster."""
    if x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type):  # bf16 (runtime.train.precision)
        out = F.linear(x, weight, bias)  # custom autograd functions would see fp32 in, bf16 gradients back
        return torch.relu(out) if relu else out
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if onednn_applies(x, weight) and _choose(x, weight, bias, relu, grad) == "onednn":
        return _onednn(x, weight, bias, relu, grad)
    return _aten(x, weight, bias, relu, grad)


class Linear(nn.Linear):
    """nn.Linear (same parameters, init and state dict) computed by `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
