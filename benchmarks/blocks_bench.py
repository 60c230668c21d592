"""Micro-benchmark of the dense blocks in runtime/modules/blocks/pooled.py at DLRM-bench sizes.

Times forward + backward of each variant of the pairwise dot interaction
(B=2048, N=27, D=64: bmm formulations and the C kernel of runtime/native)
and of the bottom and top MLPs (aten's linears, which run on MKL, against
runtime/modules/layers/linear.py's oneDNN ones), interleaving the
variants round by round (A B C A B C ...) so machine noise hits all of them
alike. Prints one JSON line per variant:

    {"bench": "dot_interaction", "variant": "naive", "fwd_bwd_ms_median": 21.3, ...}

Usage: python benchmarks/blocks_bench.py [--threads 2] [--batch 2048] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from runtime.cpu import native
from runtime.modules.blocks.pooled import MLP, DotInteraction, _PairwiseDot

NUM_VECTORS = 27
DIM = 64
BOTTOM = (13, [512, 256, 64], "relu")
TOP = (415, [512, 256, 1], None)

Step = Callable[[], None]


def naive_interaction(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """TorchRec's formulation: bmm, advanced indexing of the triangle, cat."""
    z = x.view(x.shape[0], NUM_VECTORS, DIM)
    gram = torch.bmm(z, z.transpose(1, 2))
    return torch.cat([x[:, :DIM], gram[:, rows, cols]], dim=1)


def flat_select_interaction(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Plain autograd, triangle taken with index_select on the (B, N*N) view."""
    z = x.view(x.shape[0], NUM_VECTORS, DIM)
    gram = torch.bmm(z, z.transpose(1, 2)).view(x.shape[0], -1)
    return torch.cat([x[:, :DIM], gram.index_select(1, flat)], dim=1)


def flat_gather_interaction(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Plain autograd, triangle taken with gather on the (B, N*N) view."""
    z = x.view(x.shape[0], NUM_VECTORS, DIM)
    gram = torch.bmm(z, z.transpose(1, 2)).view(x.shape[0], -1)
    return torch.cat([x[:, :DIM], gram.gather(1, flat.expand(x.shape[0], -1))], dim=1)


def _fwd_bwd(forward: Callable[[], torch.Tensor], grad: torch.Tensor, params: list[torch.Tensor]) -> Step:
    def step() -> None:
        for p in params:
            p.grad = None
        forward().backward(grad)

    return step


def interaction_steps(batch: int) -> dict[str, Step]:
    x = torch.randn(batch, NUM_VECTORS * DIM, requires_grad=True)
    bottom = torch.randn(batch, DIM, requires_grad=True)
    embeddings = torch.randn(batch, (NUM_VECTORS - 1) * DIM, requires_grad=True)
    width = DIM + NUM_VECTORS * (NUM_VECTORS - 1) // 2
    grad = torch.randn(batch, width)
    rows, cols = torch.triu_indices(NUM_VECTORS, NUM_VECTORS, offset=1)
    flat = rows * NUM_VECTORS + cols
    block = DotInteraction(NUM_VECTORS, DIM)
    pairwise = lambda: _PairwiseDot.apply(x, NUM_VECTORS, block.triu_index, block.sym_index)  # noqa: E731
    steps = {
        "naive_bmm_index": _fwd_bwd(lambda: naive_interaction(x, rows, cols), grad, [x]),
        "bmm_index_select": _fwd_bwd(lambda: flat_select_interaction(x, flat), grad, [x]),
        "bmm_gather": _fwd_bwd(lambda: flat_gather_interaction(x, flat), grad, [x]),
        "bmm_custom_autograd (runtime.modules.blocks.pooled._PairwiseDot)": _fwd_bwd(pairwise, grad, [x]),
    }
    if native.library() is not None:
        # what the compiled DLRM runs: the dense output and the embeddings as two inputs
        steps["native_c (runtime.modules.blocks.pooled, two inputs)"] = _fwd_bwd(
            lambda: block(bottom, embeddings), grad, [bottom, embeddings]
        )
    return steps


def mlp_steps(batch: int, in_features: int, layers: list[int], final: str | None) -> dict[str, Step]:
    x = torch.randn(batch, in_features, requires_grad=in_features == TOP[0])
    grad = torch.randn(batch, layers[-1])
    ours = MLP(in_features, layers, final_activation=final)

    def sequential(inplace: bool) -> nn.Sequential:
        mods: list[nn.Module] = []
        for i, layer in enumerate(ours.linears):
            plain = nn.Linear(layer.in_features, layer.out_features)  # F.linear: aten's addmm
            plain.weight, plain.bias = layer.weight, layer.bias
            mods.append(plain)
            if i < len(layers) - 1 or final is not None:
                mods.append(nn.ReLU(inplace=inplace))
        return nn.Sequential(*mods)

    params = [x, *ours.parameters()]
    out_of_place, in_place = sequential(False), sequential(True)
    return {
        "aten_linear_relu (MKL)": _fwd_bwd(lambda: out_of_place(x), grad, params),
        "aten_linear_relu_inplace (MKL)": _fwd_bwd(lambda: in_place(x), grad, params),
        "mlp (runtime.modules.blocks.pooled, oneDNN)": _fwd_bwd(lambda: ours(x), grad, params),
    }


def run(bench: str, steps: dict[str, Step], rounds: int, reps: int, extra: dict[str, object]) -> None:
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(3):
            step()
    for _ in range(rounds):
        for name, step in steps.items():
            for _ in range(reps):
                start = time.perf_counter()
                step()
                times[name].append((time.perf_counter() - start) * 1e3)
    for name, samples in times.items():
        record = {
            "bench": bench,
            "variant": name,
            "fwd_bwd_ms_median": round(statistics.median(samples), 3),
            "fwd_bwd_ms_min": round(min(samples), 3),
            **extra,
        }
        print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    extra = {"batch": args.batch, "threads": args.threads}
    run("dot_interaction", interaction_steps(args.batch), args.rounds, args.reps, extra)
    run("mlp_bottom", mlp_steps(args.batch, *BOTTOM), args.rounds, args.reps, extra)
    run("mlp_top", mlp_steps(args.batch, *TOP), args.rounds, args.reps, extra)


if __name__ == "__main__":
    main()
