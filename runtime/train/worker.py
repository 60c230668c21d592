"""The training worker: `python -m runtime.train.worker OPTIONS_JSON`.

`reccompile train` starts one of these per rank through torchrun, with the
run's `TrainOptions` (runtime.train.options) as JSON, checked already; for
one rank it calls `run(options)` in-process. The worker imports the
generated module by path, builds the model for this rank, and trains on the
module's synthetic batches or on the files `--data` names. It needs only
torch and the runtime: the compiler is not imported. Under torchrun it dies
with its parent (PR_SET_PDEATHSIG), so no rank trains on after its launcher.
"""

from __future__ import annotations

import datetime
import importlib.util
import itertools
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from runtime.cpu import choice
from runtime.cpu.allocator import retain_freed_memory
from runtime.data.batch import Batch
from runtime.data.errors import DataError
from runtime.config.heads import HeadConfig
from runtime.reporting import console
from runtime.retrieval.head import RetrievalLoss
from runtime.sharding.dense import distribute_dense
from runtime.train import checkpointing, kernel_choices, run_setup
from runtime.process.lifetime import die_with_parent, skip_exit_collection
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.early_stopping import EarlyStopping, resolve_best_metric
from runtime.train.hosts import check_plan_fits_nodes, ranks_per_node
from runtime.train.lr_plateau import plateau_from_spec
from runtime.train.lr_scheduler import LrScheduler
from runtime.train.loop import train
from runtime.train.options import TrainOptions
from runtime.train.precision import check_precision
from runtime.train.process_group import close_process_group, init_process_group
from runtime.train.timing import OtherWork

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


def load_module(path: str) -> ModuleType:
    """Import a generated module from its file path."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"generated module {path} does not exist")
    spec = importlib.util.spec_from_file_location(file.stem, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def init_distributed(device_kind: str) -> dist.ProcessGroup | None:
    """The default process group when torchrun started several ranks, else None."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return None
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if device_kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return dist.group.WORLD


def synthetic_batches(
    module: ModuleType, batch_size: int, seed: int, rank: int, world_size: int, start: int = 0
) -> Iterator[Batch]:
    for step in itertools.count(start):
        yield module.synthetic_batch(batch_size, step=step, seed=seed, rank=rank, world_size=world_size)


def main(options: TrainOptions) -> int:
    """Train as `options` say (checked by whoever built them); 0 when done.

    The numerics-changing kernel choices hold from their first use to the end
    (runtime.cpu.choice.run), or as the checkpoint resumed from recorded them.
    """
    with choice.run():
        return _train(options)


def _train(options: TrainOptions) -> int:
    retain_freed_memory()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    module = load_module(options.module)
    options = options.with_spec_defaults(module.INPUTS.training)
    steps, batch_size, seed = options.steps, options.batch_size, options.seed

    device_kind = module.INPUTS.device
    training = module.INPUTS.training
    check_precision(training.precision, device_kind, where=training.precision_where)  # this rank's CPU
    process_group = init_distributed(device_kind)
    rank = dist.get_rank() if process_group is not None else 0
    world_size = dist.get_world_size() if process_group is not None else 1
    kernel_choices.share(process_group)
    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else None
    local_ranks = ranks_per_node()
    if process_group is not None and local_ranks is not None:
        check_plan_fits_nodes(module.PLAN, local_ranks)

    torch.manual_seed(seed)
    model = module.build(process_group=process_group, device=device)
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    plateau = plateau_from_spec(training.lr_plateau, module.INPUTS.heads, options.eval_data)
    lr_scheduler = LrScheduler(module.LR_SCHEDULE, optimizer, model, plateau)
    other_work = OtherWork()
    stopping = None
    if options.best_metric is not None:
        stopping = EarlyStopping(resolve_best_metric(options.best_metric, module.INPUTS.heads), options.patience)
    checkpoints = checkpointing.Checkpointing(
        options, module, model, optimizer, process_group, rank, other_work,
        lr_scheduler=lr_scheduler, early_stopping=stopping,
    )  # fmt: skip

    def on_evaluation(step: int, metrics: dict) -> None:
        lr_scheduler.observe(metrics, step)
        if stopping is not None and stopping.observe(step, metrics):
            checkpoints.save_best(step)

    def best_result() -> dict:
        if stopping is None:
            return {}
        saved = {} if checkpoints.best_path is None else {"checkpoint": str(checkpoints.best_path)}
        return {"best": {**stopping.best(), **saved}}

    try:
        start_step = checkpoints.resume(steps)  # --resume, or a restart by torchrun
        # DDP for the dense part; the wrapper still offers `.loss` and `.dense_parameters()`.
        model = distribute_dense(model, process_group)
        run_io = run_setup.setup_run(
            options,
            module.INPUTS,
            model=model,
            synthetic=lambda: synthetic_batches(module, batch_size, seed, rank, world_size, start_step),
            steps=steps,
            log_every=options.log_every,
            global_batch=batch_size,
            rank=rank,
            world_size=world_size,
            process_group=process_group,
            device=device,
            other_work=other_work,
            resumed_vocabulary=checkpoints.resumed_vocabulary(),
            resumed_features=checkpoints.resumed_features(),
            on_evaluation=None if stopping is None and plateau is None else on_evaluation,
        )
        resumed_tracker = stopping is not None and checkpoints.resumed_early_stopping
        missed = resumed_tracker and stopping.missed(start_step, options.eval_every)
        if lr_scheduler.resumed_plateau and plateau is not None:
            missed = missed or plateau.missed(start_step, options.eval_every)
        if missed:
            run_io.monitor.evaluate(start_step)  # so the counts go on as in the run that saved them
        batches = checkpoints.position(run_io.batches, options.data)
        depth = options.pipeline_depth_for(world_size)
        if device is not None and depth == 1:  # pipelined, the pipeline copies (pinned, ahead)
            batches = (b.to(device, non_blocking=True) for b in batches)

        summary = train(
            model,
            batches,
            steps=steps,
            optimizer=optimizer,
            global_batch_size=batch_size,
            log_every=options.log_every,
            on_log=run_io.monitor.on_log,
            on_step=checkpoints.chain(run_io.monitor.on_step),
            process_group=process_group,
            start_step=start_step,
            pipeline_depth=depth,
            device=device,
            precision=training.precision,
            other_work=other_work,
            lr_scheduler=lr_scheduler,
            should_stop=None if stopping is None else stopping.should_stop,
        )
        last_step = start_step + summary.steps
        _check_pairs_trained(model, module.INPUTS.heads, summary.steps)
        if stopping is not None and stopping.stop_reason is not None and last_step < steps:
            run_io.monitor.stop(last_step, stopping.stop_reason)
        checkpoints.finish(last_step)
        # The time of work outside the steps is read after the final evaluation, which it includes.
        final = run_io.finish(summary.as_json(), lambda: {**best_result(), **other_work.as_json()})
    finally:
        checkpoints.close()
    if rank == 0:
        console.result(final)
    return 0  # run() closes the process group, where this frame's model is gone


def _check_pairs_trained(model: torch.nn.Module, heads: Sequence[HeadConfig], steps: int) -> None:
    """A retrieval head that trained on no pair in the whole run learnt nothing: an error naming its
    item feature, not a loss of 0 and null metrics (every history of the data shorter than 2 items)."""
    losses = [m for m in model.modules() if isinstance(m, RetrievalLoss)]
    if not steps or not losses or any(loss.pairs_trained for loss in losses):
        return
    head = next(h for h in heads if h.loss == "sampled_softmax")
    raise DataError(
        f"head {head.name!r}: nothing to learn from in {steps:,} steps: no sample of feature {head.label!r} "
        "has a positive (a next-item history needs 2 items or more; a two-tower sample one item)"
    )


def run(options: TrainOptions) -> int:
    """`main`, with any error reported as one `error: rank R: ...` line and exit status 1.

    Under torchrun every failing rank reports; `reccompile train` shows each
    distinct message once. RECCOMPILE_TRACEBACK=1 prints the traceback too.
    The process group ends here, before the interpreter does
    (runtime.train.process_group).
    """
    ours = not dist.is_initialized()  # a group the caller made is the caller's to close
    try:
        return main(options)
    except Exception as error:  # the job must end with a message, never a bare traceback
        if os.environ.get("RECCOMPILE_TRACEBACK") == "1":
            traceback.print_exc()
        console.say(f"error: rank {os.environ.get('RANK', '0')}: {error}", sys.stderr)
        return 1
    finally:
        if ours:
            close_process_group()


if __name__ == "__main__":
    die_with_parent()
    skip_exit_collection()
    if len(sys.argv) != 2:
        sys.exit("usage: python -m runtime.train.worker OPTIONS_JSON (see runtime/train/options.py)")
    try:
        sys.exit(run(TrainOptions.from_json(sys.argv[1])))
    except KeyboardInterrupt:  # the launcher was interrupted and stops the job: no traceback
        sys.exit(130)
