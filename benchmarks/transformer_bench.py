"""Micro-benchmark of runtime/modules/blocks/transformer.py against torch.nn.TransformerEncoderLayer.

Forward + backward of one encoder layer at seq-bench's shapes
(../shared/bench/SEQUENCE.md: batch 1,024, 51 positions = target + 1-50
history items, dim 64, 2 heads, FFN 256, post-norm, learned positions,
padding masked), with the same weights and the same input and lengths for
all; the variants alternate round by round (A B C A B C ...) so machine
noise hits all alike. `runtime_first` is the layer as seq-bench's model
builds it (`output="first"`: only the target's position, which is all the
model reads), given that position's gradient. Prints one JSON line per variant:

    {"bench": "transformer", "variant": "runtime", "fwd_bwd_ms_median": 41.2, ...}

Usage: python benchmarks/transformer_bench.py [--threads 1] [--batch 1024] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from runtime.modules.blocks.transformer import Transformer

DIM, HEADS, FFN, POSITIONS, MAX_HISTORY = 64, 2, 256, 51, 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    block = Transformer(DIM, HEADS, FFN, max_length=POSITIONS)
    first = Transformer(DIM, HEADS, FFN, max_length=POSITIONS, output="first")
    first.load_state_dict(block.state_dict())
    reference = nn.TransformerEncoderLayer(DIM, HEADS, FFN, dropout=0.0, batch_first=True)
    reference.load_state_dict(block.layers[0].state_dict())
    positions = nn.Parameter(block.positions.detach().clone())
    x = torch.randn(args.batch, POSITIONS, DIM, requires_grad=True)
    lengths = 1 + torch.randint(1, MAX_HISTORY + 1, (args.batch,))  # the target + the history
    padding = torch.arange(POSITIONS).unsqueeze(0) >= lengths.unsqueeze(1)
    grad = torch.randn(args.batch, POSITIONS, DIM)

    def runtime_step() -> None:
        block(x, lengths).backward(grad)

    def torch_step() -> None:
        reference(x + positions, src_key_padding_mask=padding).backward(grad)

    def first_step() -> None:
        first(x, lengths).backward(grad[:, 0])

    variants: dict[str, Callable[[], None]] = {
        "runtime": runtime_step,
        "runtime_first": first_step,
        "torch": torch_step,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(args.rounds + 2):
        for name, step in variants.items():
            start = time.perf_counter()
            step()
            if round_index >= 2:  # two warm-up rounds
                times[name].append((time.perf_counter() - start) * 1e3)
    for name, samples in times.items():
        print(
            json.dumps(
                {
                    "bench": "transformer",
                    "variant": name,
                    "batch": args.batch,
                    "threads": args.threads,
                    "fwd_bwd_ms_median": round(statistics.median(samples), 2),
                    "fwd_bwd_ms_min": round(min(samples), 2),
                    "rounds": args.rounds,
                }
            )
        )


if __name__ == "__main__":
    main()
