"""Scaled dot-product attention over padded sequences, in fp32 or bf16 under bf16 training.

Under a CPU bf16 autocast (runtime.train.precision) torch runs
`F.scaled_dot_product_attention` in bf16, and on AMD EPYC Zen 4 (avx512_bf16,
one thread) its flash kernel's forward and backward took 2.6x the time of
fp32's at gen-bench's shapes (256 histories of 100, 2 heads of 32: 193 against
74 ms). So under bf16 the attention is a kernel choice (runtime.cpu.choice's
`attention_precision`): autocast's bf16, or the same call with autocast off on
fp32 copies of q, k and v, measured at first use on the layer's real shapes
(forward and backward) and held for the run. Outside a bf16 autocast nothing
is measured and torch's call runs as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from runtime.cpu import choice
from runtime.modules.layers.autocast import bf16_autocast

__all__ = ["padded_attention"]


def _fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allowed)


def _autocast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def _choose(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> str:
    """'fp32' or 'autocast' for this layer, timed on copies (forward and backward, under the caller's autocast)."""
    batch, heads, length, dim = q.shape
    shape = f"b{choice.bucket(batch)}_l{length}_h{heads}_d{dim}_t{torch.get_num_threads()}"

    @functools.cache  # copied only if a measurement runs
    def copies() -> list[torch.Tensor]:
        return [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def timed(path: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            with torch.enable_grad():
                out = path(*copies(), allowed)
                return torch.autograd.grad(out, copies(), torch.ones_like(out))

        return run

    site = f"h{heads}_d{dim}"  # the layer: not the batch's size or length
    return choice.choose("attention_precision", shape, {"autocast": timed(_autocast), "fp32": timed(_fp32)}, site=site)


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, attn_mask=allowed); under a CPU bf16 autocast, in the
    precision measured faster here (module docstring)."""
    if q.device.type == "cpu" and bf16_autocast() and _choose(q, k, v, allowed) == "fp32":
        return _fp32(q, k, v, allowed)
    return _autocast(q, k, v, allowed)
