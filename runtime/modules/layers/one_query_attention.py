"""Attention of one query per sample and head over the first positions of a padded sequence.

The kernel under a transformer read at one position (runtime/modules/blocks/transformer.py,
output "first" or "last"): queries [B, heads, D] already in the input's space,
keys and values the input rows x [B, L, D] themselves, sample b attending to
its positions 0 .. counts[b]-1 (counts >= 1):

    s = x q_h,  p = softmax over the positions,  out_h = sum_l p_l x_l     -> [B, heads, D]

Two implementations: torch's (two `bmm` and a masked softmax, the baseline)
and a C kernel (runtime/cpu/native/one_query_attention.c), whose per-sample
loops skip the padding and avoid `bmm`'s per-matrix overhead on these tiny
products. The faster for the caller's shapes is chosen by measurement
(runtime/cpu/choice.py, kernel 'attention'); both give the same values up to
float32 summation order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from runtime.cpu import choice, native

__all__ = ["one_query_attention"]


def _torch(x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    keys = torch.arange(x.shape[1], device=x.device) < counts.unsqueeze(1)
    scores = torch.bmm(x, query.transpose(1, 2)).masked_fill(~keys.unsqueeze(2), float("-inf"))
    return torch.bmm(torch.softmax(scores, dim=1).transpose(1, 2), x)


class _NativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x, query = x.contiguous(), query.contiguous()
        counts = counts.to(torch.int64).contiguous()
        weighted, probs = native.one_query_attention_forward(x, query, counts)
        ctx.save_for_backward(x, query, counts, probs)
        return weighted

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, query, counts, probs = ctx.saved_tensors
        grad_x, grad_query = native.one_query_attention_backward(x, query, counts, probs, grad.contiguous())
        return grad_x, grad_query, None


def _native(x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return _NativeAttention.apply(x, query, counts)


def _choose(x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor, grad: bool) -> str:
    """'native' or 'torch' for these shapes, timed on copies (with backward if `grad`)."""
    (batch, length, dim), heads = x.shape, query.shape[1]
    shape = (
        f"b{choice.bucket(batch)}_l{length}_h{heads}_d{dim}_{'fwdbwd' if grad else 'fwd'}_t{torch.get_num_threads()}"
    )

    @functools.cache  # copied only if a measurement runs
    def copies() -> list[torch.Tensor]:
        return [t.detach().clone().requires_grad_(grad) for t in (x, query)]

    def timed(path: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            with torch.enable_grad() if grad else torch.no_grad():
                out = path(*copies(), counts)
                return torch.autograd.grad(out, copies(), torch.ones_like(out)) if grad else out

        return run

    site = f"h{heads}_d{dim}_{'fwdbwd' if grad else 'fwd'}"  # the layer: not the batch's size or length
    return choice.choose("attention", shape, {"torch": timed(_torch), "native": timed(_native)}, site=site)


def one_query_attention(x: torch.Tensor, query: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B, heads, D]: each query's softmax-weighted sum of x's first counts[b] rows (see the module docstring).

    x [B, L, D], query [B, heads, D] (scaled as the caller wants), counts [B] in [1, L].
    """
    grad = torch.is_grad_enabled() and (x.requires_grad or query.requires_grad)
    if x.shape[0] and native.applies([x, query]) and _choose(x, query, counts, grad) == "native":
        return _native(x, query, counts)
    return _torch(x, query, counts)
