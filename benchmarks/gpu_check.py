"""gpu-check (`make gpu-check`): the CUDA paths, run once on one GPU, in about 10 minutes at most.

No GPU was available to this project while its CUDA paths were written
(fbgemm's CUDA TBE, NCCL, the pipeline's CUDA streams and copies, inference on
CUDA), so this is what runs the first time one is lent. Checks, each a child
process with a time limit, one JSON line each (`check`, `ok`, `seconds`,
`detail`), then a summary line:

    train:<type>     `reccompile train` at 1 rank on CUDA, every table of a
                     small DLRM constrained to one sharding type (data_parallel,
                     table_wise, column_wise, row_wise, table_row_wise), plain loop
    train:pipeline   the same model, tables of every type at once, through the
                     train pipeline, writing a checkpoint
    export+predict   `reccompile export` of that checkpoint, then its eval model
                     moved to CUDA scores a synthetic batch; the scores must match
                     the CPU's (max abs difference <= 1e-4)
    dlrm-bench       benchmarks/dlrm_bench.py --device cuda (criteo, local, 20 steps);
                     TorchRec beside it only where an anchor runs on CUDA: the
                     shared torchrec_bench.py places everything on the CPU, so its
                     line says so instead of a ratio

Exit 0 when every check passed, 1 otherwise. Without a CUDA device it prints
one line saying so and exits 0: there is nothing to check.

    python benchmarks/gpu_check.py [--only train:row_wise,dlrm-bench]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")
TABLES = ("a", "b", "c", "d", "e")
STEPS = 20
CHECK_SECONDS = 120  # a check's limit; 9 checks stay under 10 minutes with the GPU's warm-up
SCORE_TOLERANCE = 1e-4

SPEC = """\
version: 1
name: gpu_check_{case}
features:
  dense:
    - {{name: num, size: 4}}
  sparse:
    - {{name: a, num_embeddings: 600, dim: 16}}
    - {{name: b, num_embeddings: 400, dim: 16, pooling: mean, max_ids_per_sample: 4}}
    - {{name: c, num_embeddings: 500, dim: 16, weighted: true, max_ids_per_sample: 3}}
    - {{name: d, num_embeddings: 300, dim: 16}}
    - {{name: e, num_embeddings: 200, dim: 16, max_ids_per_sample: 2}}
model:
  bottom: {{type: mlp, input: dense.num, layers: [16]}}
  interaction: {{type: dot, input: [bottom, sparse.*]}}
  top: {{type: mlp, input: [bottom, interaction], layers: [16, 1]}}
heads:
  - {{name: click, input: top, loss: bce}}
training:
  batch_size: 256
  dense_optimizer: {{type: adagrad, lr: 0.05}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
sharding:
  device: cuda
  constraints:
{constraints}
"""


def spec_text(case: str) -> str:
    """The check model with every table of sharding type `case`, or one type per table for `mixed`."""
    types = SHARDING_TYPES if case == "mixed" else (case,) * len(TABLES)
    constraints = "\n".join(f"    {table}: {{sharding_types: [{kind}]}}" for table, kind in zip(TABLES, types))
    return SPEC.format(case=case, constraints=constraints)


def run_child(command: list[str], cwd: Path) -> tuple[bool, str]:
    """(exit code 0, the last lines of its output or why it did not finish)."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=CHECK_SECONDS)
    except subprocess.TimeoutExpired:
        return False, f"did not finish in {CHECK_SECONDS} s"
    text = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, "\n".join(text[-5:])


def reccompile(*args: str) -> list[str]:
    return [sys.executable, "-m", "compiler.cli", *args]


def check_train(case: str, work: Path, pipeline: bool) -> tuple[bool, str]:
    spec = work / f"{case}.yaml"
    spec.write_text(spec_text(case))
    command = reccompile(
        "train",
        str(spec),
        "--steps",
        str(STEPS),
        "-o",
        str(work / f"build_{case}"),
        "--pipeline" if pipeline else "--no-pipeline",
    )
    if pipeline:
        command += ["--checkpoint-dir", str(work / "checkpoints"), "--checkpoint-every", str(STEPS)]
    return run_child(command, REPO)


def check_export_predict(work: Path) -> tuple[bool, str]:
    spec = work / "mixed.yaml"
    if not (work / "checkpoints").is_dir():
        return False, "no checkpoint: train:pipeline did not write one"
    ok, out = run_child(
        reccompile("export", str(spec), "--checkpoint", str(work / "checkpoints"), "-o", str(work / "export")), REPO
    )
    if not ok:
        return False, out
    return run_child([sys.executable, str(Path(__file__).resolve()), "--score-on-cuda", str(work / "export")], REPO)


def score_on_cuda(export: str) -> int:
    """Child of export+predict: the exported eval model's scores of one synthetic batch, CPU against CUDA."""
    import torch

    sys.path.insert(0, str(REPO))
    from runtime.data.synthetic.batches import make_batch
    from runtime.serving.export_dir import load

    module, model = load(export)
    batch = make_batch(module.INPUTS, 512, step=0)  # what `reccompile predict` scores without --data
    with torch.inference_mode():
        cpu = model.scores(model(batch.dense, batch.sparse))
        model = model.to("cuda")
        on_gpu = batch.to("cuda")
        cuda = model.scores(model(on_gpu.dense, on_gpu.sparse))
    worst = max(float((cpu[name] - cuda[name].cpu()).abs().max()) for name in cpu)
    print(f"max |cpu - cuda| score difference {worst:.3g} over {batch.batch_size} samples")
    return 0 if worst <= SCORE_TOLERANCE else 1


def check_dlrm_bench(work: Path) -> tuple[bool, str]:
    ok, out = run_child(
        [
            sys.executable,
            str(REPO / "benchmarks" / "dlrm_bench.py"),
            "--mode",
            "local",
            "--device",
            "cuda",
            "--steps",
            str(STEPS),
        ],
        REPO,
    )
    if ok:
        line = json.loads(out.splitlines()[-1])
        out = f"criteo local on CUDA: {line['samples_per_s']} samples/s, step {line['step_ms_median']} ms"
    return ok, out + "; TorchRec: not run (the shared torchrec_bench.py trains on the CPU only)"


def checks() -> list[str]:
    return [*(f"train:{kind}" for kind in SHARDING_TYPES), "train:pipeline", "export+predict", "dlrm-bench"]


def run_check(name: str, work: Path) -> tuple[bool, str]:
    if name.startswith("train:"):
        case = name.split(":", 1)[1]
        return check_train("mixed" if case == "pipeline" else case, work, pipeline=case == "pipeline")
    if name == "export+predict":
        return check_export_predict(work)
    return check_dlrm_bench(work)


def gpu_name() -> str | None:
    """The first CUDA device's name, or None without one (or without a CUDA build of torch)."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return torch.cuda.get_device_name(0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated checks, of: {', '.join(checks())}")
    parser.add_argument("--score-on-cuda", metavar="EXPORT", help=argparse.SUPPRESS)  # export+predict's child
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.score_on_cuda:
        return score_on_cuda(args.score_on_cuda)
    selected = checks() if args.only is None else args.only.split(",")
    unknown = sorted(set(selected) - set(checks()))
    if unknown:
        print(f"error: --only: unknown check {unknown[0]!r} (known: {', '.join(checks())})", file=sys.stderr)
        return 2
    device = gpu_name()
    if device is None:
        print(
            json.dumps(
                {
                    "check": "gpu",
                    "ok": True,
                    "skipped": True,
                    "detail": "no CUDA GPU on this machine (torch.cuda.is_available() is False): nothing to check",
                }
            )
        )
        return 0
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for name in selected:
            started = time.perf_counter()
            ok, detail = run_check(name, Path(tmp))
            results.append(
                {"check": name, "ok": ok, "seconds": round(time.perf_counter() - started, 1), "detail": detail}
            )
            print(json.dumps(results[-1]), flush=True)
    failed = [r["check"] for r in results if not r["ok"]]
    print(
        json.dumps(
            {
                "summary": "gpu-check",
                "gpu": device,
                "passed": len(results) - len(failed),
                "failed": failed,
                "seconds": round(sum(r["seconds"] for r in results), 1),
            }
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
