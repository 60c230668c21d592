"""`reccompile train SPEC`: compile, then train on this host's ranks.

One rank trains in this process; several ranks are torchrun workers
(`python -m runtime.train.worker`), gloo on CPU and NCCL on CUDA. torchrun's own
multi-host options pass through, so many nodes run the same command.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from compiler.codegen.emit import emit
from compiler.commands.common import add_spec_arguments, options_from_args, reporting_errors
from compiler.pipeline import compile_spec
from runtime.train import checkpointing
from runtime.train import train_pipeline
from runtime.train import run_setup
from runtime.train import worker

_WORKER_ERROR = re.compile(r"^error: rank (\d+): (.*)$")

# torchrun options passed through unchanged (see `torchrun --help`).
TORCHRUN_OPTIONS = (
    "--nnodes",
    "--node-rank",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--master-addr",
    "--master-port",
    "--max-restarts",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser)
    parser.add_argument("--nproc", type=int, default=1, help="ranks on this host (default 1)")
    parser.add_argument("--steps", type=int, help="default: the spec's training.steps")
    parser.add_argument("--batch-size", type=int, help="global batch size (default: the spec's)")
    parser.add_argument("--seed", type=int, help="default: the spec's training.seed")
    parser.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    parser.add_argument("-o", "--outdir", type=Path, default=Path("build"), help="default: build/")
    run_setup.add_arguments(parser.add_argument_group("data and reporting (see runtime/train/run_setup.py)"))
    checkpointing.add_arguments(parser.add_argument_group("checkpoints (see runtime/train/checkpointing.py)"))
    train_pipeline.add_arguments(parser.add_argument_group("training pipeline (see runtime/train/train_pipeline.py)"))
    torchrun = parser.add_argument_group("torchrun options (passed through)")
    for option in TORCHRUN_OPTIONS:
        torchrun.add_argument(option, dest=_dest(option))


def run(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        print(f"error: --nproc must be at least 1, got {args.nproc}", file=sys.stderr)
        return 2
    problem = checkpointing.usage_error(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        nnodes = int(args.torchrun_nnodes) if args.torchrun_nnodes is not None else 1
    except ValueError:
        print(f"error: --nnodes must be a fixed count, got {args.torchrun_nnodes!r}", file=sys.stderr)
        return 2
    world_size = args.nproc * nnodes

    def action() -> int:
        lowered = compile_spec(args.spec, options_from_args(args, world_size=world_size))
        module_path = emit(lowered).write(args.outdir)[0]
        worker_args = [str(module_path), "--log-every", str(args.log_every)]
        for option in ("steps", "batch_size", "seed"):
            if getattr(args, option) is not None:
                worker_args += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
        worker_args += run_setup.pass_through(args)
        worker_args += checkpointing.pass_through(args)
        worker_args += train_pipeline.pass_through(args)
        if world_size == 1:
            return worker.run(worker_args)
        return run_torchrun(_torchrun_command(args, worker_args))

    return reporting_errors(action)


def run_torchrun(command: list[str]) -> int:
    """Run torchrun, passing output through; each distinct worker error is shown once.

    Every rank that fails prints `error: rank R: MESSAGE`; the same message from
    several ranks, and torchrun's own failure report after it, add nothing.
    """
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # torchrun's shared rendezvous store keeps the last attempt's keys, so workers restarted
    # by --max-restarts may connect to their dead predecessors (pytorch/pytorch#135712).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    seen: set[str] = set()
    for line in process.stderr:
        match = _WORKER_ERROR.match(line)
        if match:
            if match.group(2) not in seen:
                seen.add(match.group(2))
                sys.stderr.write(line)
        elif not seen:
            sys.stderr.write(line)
    return process.wait()


def _torchrun_command(args: argparse.Namespace, worker_args: list[str]) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}"]
    passed = {o: getattr(args, _dest(o)) for o in TORCHRUN_OPTIONS if getattr(args, _dest(o)) is not None}
    if not {"--nnodes", "--rdzv-endpoint", "--master-addr"} & passed.keys():
        command.append("--standalone")  # one host: a free port, no rendezvous set-up
    command += [f"{option}={value}" for option, value in passed.items()]
    return command + ["-m", "runtime.train.worker", *worker_args]


def _dest(option: str) -> str:
    return "torchrun_" + option.lstrip("-").replace("-", "_")
