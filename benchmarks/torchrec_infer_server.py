"""TorchRec's side of inference_bench.py's interleaved timing, run in the TorchRec venv.

Builds the model of ../shared/bench/torchrec_infer_bench.py at one precision
with that script's own functions (build_fp32_model, quantize, make_inputs,
forward), so what is timed is exactly what its anchor times, then serves
timing requests (the protocol of inference_bench.serve):

    python benchmarks/torchrec_infer_server.py --precision int8 --variant criteo --batch 512 \
        [--threads 2] [--dense int8]

`--dense int8` also quantizes the MLPs' nn.Linear layers with torch's own
dynamic int8 (`torch.ao.quantization.quantize_dynamic`, qint8 weights), what a
TorchRec user would do; the anchor keeps them fp32. inference_bench.py asks it
for its `int8/int8` configuration, so that the two sides' MLPs are both int8.

prints {"ready": ...} after 20 warm-up calls, then for each line "N U" read
from stdin makes U untimed calls and N timed ones, whose nanoseconds it prints
as a JSON list. Ends at end of input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", required=True, choices=["fp32", "fp16", "int8", "int4"])
    parser.add_argument("--variant", required=True, choices=["criteo", "multihot"])
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dense", default="fp32", choices=["fp32", "int8"])
    parser.add_argument(
        "--bench-dir",
        default=os.environ.get("RECCOMPILE_BENCH_WORKLOADS"),
        help="the shared bench folder (default: ../shared/bench beside the checkout)",
    )
    args = parser.parse_args(argv)
    folder = args.bench_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench")
    sys.path.insert(0, os.path.abspath(folder))
    import torch
    import torchrec_infer_bench as anchor

    torch.set_num_threads(args.threads)
    model = anchor.build_fp32_model()
    if args.precision != "fp32":
        model = anchor.quantize(model, args.precision)
    if args.dense == "int8":
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8).eval()
    inputs = anchor.make_inputs(args.variant, args.batch, anchor.NBATCH)
    calls = 0
    with torch.inference_mode():
        for _ in range(anchor.WARMUP):
            anchor.forward(model, inputs[calls % len(inputs)], args.batch)
            calls += 1
        print(json.dumps({"ready": True, "threads": torch.get_num_threads()}), flush=True)
        for line in sys.stdin:
            timed, untimed = (int(n) for n in line.split())
            times = []
            for n in range(untimed + timed):
                item = inputs[calls % len(inputs)]
                started = time.perf_counter_ns()
                anchor.forward(model, item, args.batch)
                if n >= untimed:
                    times.append(time.perf_counter_ns() - started)
                calls += 1
            print(json.dumps(times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
