"""`reccompile train SPEC`: compile, then train on this host's ranks.

One rank trains in this process; several ranks are torchrun workers
(`python -m runtime.train.worker OPTIONS_JSON`), gloo on CPU and NCCL on
CUDA. torchrun's own multi-host options pass through, so many nodes run the
same command. Every option is checked here, once (runtime.train.options);
a usage error is one line and exit status 2, before anything starts.

The job ends with a message, never a traceback: a rank's error once
(runtime.train.torchrun_output), a rank killed by a signal with the
checkpoint to resume from, and Ctrl-C with exit status 130 and the same.
torchrun gets SIGTERM when this process dies, even by SIGKILL, and takes
the ranks with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from compiler.codegen.emit import emit
from compiler.commands.common import add_spec_arguments, options_from_args, outdir_problem, reporting_errors
from compiler.commands.train_launch import interrupted_message, interrupted_status, run_torchrun, stop_on_sigterm
from compiler.lowering.instantiate import model_inputs
from compiler.pipeline import compile_spec
from runtime.data.errors import DataError
from runtime.data.sources import choose_data
from runtime.train import options as train_options
from runtime.train import worker
from runtime.train.early_stopping import resolve_best_metric
from runtime.train.lr_plateau import plateau_from_spec
from runtime.train.limits import MAX_RANKS_PER_HOST, range_problem
from runtime.train.options import TrainOptions, UsageError
from runtime.cpu.threads import ThreadChoice, choose_threads, given_threads

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
    parser.add_argument("-o", "--outdir", type=Path, default=Path("build"), help="default: build/")
    train_options.add_arguments(parser)
    torchrun = parser.add_argument_group("torchrun options (passed through)")
    for option in TORCHRUN_OPTIONS:
        torchrun.add_argument(option, dest=_dest(option))


def run(args: argparse.Namespace) -> int:
    try:
        world_size = _world_size(args)
        problem = outdir_problem("-o", args.outdir)
        if problem is not None:
            raise UsageError(problem)
        options = train_options.from_args(args, module="", world_size=world_size)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def action() -> int:
        # Unless --ranks-per-host or the spec say otherwise, a host holds the ranks torchrun
        # starts on it (its local world size), so table_row_wise stays within each node.
        compile_options = options_from_args(args, world_size=world_size, launched_ranks_per_host=args.nproc)
        lowered = compile_spec(args.spec, compile_options)
        inputs = model_inputs(lowered.ir)
        ready = options.with_spec_defaults(inputs.training)
        unused = options.spec_early_stopping_unused(inputs.training)
        if unused is not None:
            print(f"note: {unused}", file=sys.stderr)
        try:
            data = choose_data(options.data, inputs)
            reads_files = data.reader != "synthetic"
            train_options.check_early_stopping(ready)
            train_options.check_shuffle_window(ready, str(data))
            if ready.best_metric is not None:
                resolve_best_metric(ready.best_metric, inputs.heads)
            plateau_from_spec(inputs.training.lr_plateau, inputs.heads, ready.eval_data)
        except (DataError, UsageError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        choice = _threads(ready, args.nproc, reads_files)
        module_path = emit(lowered).write(args.outdir)[0]
        ready = dataclasses.replace(ready, module=str(module_path), threads=choice.threads)
        ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
        if world_size != args.nproc:
            ranks += f" ({world_size // args.nproc} nodes × {args.nproc} rank{'s' if args.nproc != 1 else ''})"
        print(f"training {lowered.ir.name} on {ranks}: {choice.describe()}", flush=True)
        if world_size == 1:
            return worker.run(ready)
        # torchrun's per-rank log folders (empty unless a rank fails, whose report it prints) go
        # in a folder of our own that goes with the job: by default each job left one in /tmp.
        with tempfile.TemporaryDirectory(prefix="reccompile-torchrun-") as logs:
            command = _torchrun_command(args, ready, Path(logs))
            return run_torchrun(command, ready.checkpoint_dir, threads=choice.threads)

    try:
        with stop_on_sigterm():
            return reporting_errors(action)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM in this process (torchrun's ranks: run_torchrun stops them)
        print(interrupted_message(options.checkpoint_dir, stop), file=sys.stderr)
        return interrupted_status(stop)


def _world_size(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    if args.nproc > MAX_RANKS_PER_HOST:
        raise UsageError(range_problem("--nproc", args.nproc, 1, MAX_RANKS_PER_HOST) or "")
    if args.torchrun_max_restarts is not None:
        restarts = _whole(args.torchrun_max_restarts, "--max-restarts")
        if restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, got {restarts}")
    if args.torchrun_nnodes is None:
        launched, how = args.nproc, f"--nproc {args.nproc}"
    else:
        try:
            launched = args.nproc * int(args.torchrun_nnodes)
        except ValueError:
            raise UsageError(f"--nnodes must be a fixed count, got {args.torchrun_nnodes!r}") from None
        how = f"--nproc {args.nproc} on --nnodes {args.torchrun_nnodes}"
    if args.world_size is not None and args.world_size != launched:
        raise UsageError(
            f"--world-size {args.world_size}, but this run starts {launched} rank{'s' if launched != 1 else ''} "
            f"({how}); train plans for the ranks it starts: leave --world-size out or make them agree"
        )
    return launched


def _whole(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag} must be a whole number, got {text!r}") from None


def _threads(options: TrainOptions, nproc: int, reads_files: bool) -> ThreadChoice:
    if options.threads is not None:
        return given_threads(options.threads)
    return choose_threads(nproc, options.data_workers if reads_files else 0)


def _torchrun_command(args: argparse.Namespace, options: TrainOptions, logs: Path) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}", f"--log-dir={logs}"]
    passed = {o: getattr(args, _dest(o)) for o in TORCHRUN_OPTIONS if getattr(args, _dest(o)) is not None}
    if not {"--nnodes", "--rdzv-endpoint", "--master-addr"} & passed.keys():
        command.append("--standalone")  # one host: a free port, no rendezvous set-up
    command += [f"{option}={value}" for option, value in passed.items()]
    return command + ["-m", "runtime.train.worker", options.to_json()]


def _dest(option: str) -> str:
    return "torchrun_" + option.lstrip("-").replace("-", "_")
