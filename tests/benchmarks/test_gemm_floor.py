"""benchmarks/gemm_floor.py: the products a step makes, counted against the layers' own arithmetic."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

from runtime.modules.layers.linear import MIN_ONEDNN_MACS, Linear

REPO = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("gemm_floor", REPO / "benchmarks" / "gemm_floor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_layer_and_a_batched_product_forward_and_backward() -> None:
    floor = _module()
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4, requires_grad=True)
    pairs = torch.randn(2, 6, 4, requires_grad=True)

    def step() -> None:
        (layer(x).sum() + torch.bmm(pairs, pairs.transpose(1, 2)).sum()).backward()

    shapes = floor.gemm_shapes(step)
    f32 = torch.float32
    assert shapes == {
        ((5, 4), (4, 3), f32): 1,  # y = x W^T + b
        ((5, 3), (3, 4), f32): 1,  # dx = g W
        ((3, 5), (5, 4), f32): 1,  # dW = g^T x
        ((2, 6, 4), (2, 4, 6), f32): 1,  # forward
        ((2, 6, 6), (2, 6, 4), f32): 1,  # the two factors' gradients
        ((2, 4, 6), (2, 6, 6), f32): 1,
    }
    assert sum(n * floor.flops(s) for s, n in shapes.items()) == 3 * (2 * 5 * 4 * 3) + 3 * (2 * 2 * 6 * 4 * 6)
    got = floor.floor(shapes, repeats=2)
    assert got["gemm_floor_ms"] > 0 and got["dense_gflop"] == round(
        sum(n * floor.flops(s) for s, n in shapes.items()) / 1e9, 4
    )


def test_products_on_onednn_are_counted_through_torchs_own_path() -> None:
    """A layer big enough for oneDNN, which the run forces: the count still sees its three products."""
    floor = _module()
    layer = Linear(64, 256)
    x = torch.randn(MIN_ONEDNN_MACS // (64 * 256) + 1, 64, requires_grad=True)
    saved = os.environ.get("RECCOMPILE_KERNELS")
    os.environ["RECCOMPILE_KERNELS"] = "linear=onednn"
    try:
        shapes = floor.gemm_shapes(lambda: layer(x).sum().backward())
        assert os.environ["RECCOMPILE_KERNELS"] == "linear=onednn"  # put back
    finally:
        if saved is None:
            del os.environ["RECCOMPILE_KERNELS"]
        else:
            os.environ["RECCOMPILE_KERNELS"] = saved
    assert sum(shapes.values()) == 3
    assert sum(n * floor.flops(s) for s, n in shapes.items()) == 3 * 2 * x.shape[0] * 64 * 256
