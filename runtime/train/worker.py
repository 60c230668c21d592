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
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from runtime.config.heads import HeadConfig
from runtime.cpu import choice
from runtime.cpu.allocator import retain_freed_memory
from runtime.data.batch import Batch
from runtime.data.errors import DataError
from runtime.process.lifetime import die_with_parent, skip_exit_collection
from runtime.reporting import console
from runtime.retrieval.head import RetrievalLoss
from runtime.sharding.dense import distribute_dense
from runtime.train import checkpointing, kernel_choices, run_setup
from runtime.train.best_checkpoint import BestCheckpoint, TrackerState, early_stopping
from runtime.train.callbacks import CallbackList
from runtime.train.context import RunContext
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.hosts import check_plan_fits_nodes, ranks_per_node
from runtime.train.loop import train
from runtime.train.lr_plateau import plateau_from_spec
from runtime.train.lr_scheduler import LrScheduler, ReduceOnPlateau, ScheduleState
from runtime.train.options import TrainOptions
from runtime.train.precision import check_precision
from runtime.train.process_group import close_process_group, init_process_group

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
    context = build_context(options.with_spec_defaults(module.INPUTS.training), module)
    options, training = context.options, context.inputs.training
    if context.process_group is not None and (local_ranks := ranks_per_node()) is not None:
        check_plan_fits_nodes(module.PLAN, local_ranks)

    torch.manual_seed(context.seed)
    model = module.build(process_group=context.process_group, device=context.device)
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    plateau = plateau_from_spec(training.lr_plateau, context.inputs.heads, options.eval_data)
    lr_scheduler = LrScheduler(module.LR_SCHEDULE, optimizer, model, plateau)
    # What a checkpoint keeps besides the model and optimizer, in the manifest's order.
    checkpoints = checkpointing.Checkpointing(context, model, optimizer)
    checkpoints.register("lr_schedule", ScheduleState(lr_scheduler, checkpoints.saving_step))
    stopping = early_stopping(context)
    tracker = None if stopping is None else TrackerState(stopping)
    if tracker is not None:
        checkpoints.register("early_stopping", tracker)
    checkpoints.register("kernels", kernel_choices.KernelChoices(context.process_group, _warn_on_rank_0(context)))
    callbacks = CallbackList()

    try:
        start_step = checkpoints.resume()  # --resume, or a restart by torchrun
        # DDP for the dense part; the wrapper still offers `.loss` and `.dense_parameters()`.
        model = distribute_dense(model, context.process_group)
        run_io = run_setup.setup_run(
            context,
            model,
            lambda: synthetic_batches(
                module, context.global_batch, context.seed, context.rank, context.world_size, start_step
            ),
            resumed_vocabulary=checkpoints.resumed_vocabulary(),
            resumed_features=checkpoints.resumed_features(),
            on_evaluation=callbacks.on_eval,
        )
        # In the order they run at every hook (runtime.train.callbacks).
        callbacks.append(run_setup.MonitorHooks(run_io.monitor))
        callbacks.append(None if plateau is None else ReduceOnPlateau(lr_scheduler, options.eval_every))
        callbacks.append(None if tracker is None else BestCheckpoint(context, tracker, checkpoints, run_io.monitor))
        callbacks.append(checkpoints)
        run_io.monitor.begin(start_step)
        if callbacks.evaluate_on_resume(start_step):
            run_io.monitor.evaluate(start_step)  # so the counts go on as in the run that saved them
        batches = checkpoints.position(run_io.batches)
        if context.device is not None and context.pipeline_depth == 1:  # pipelined, the pipeline copies
            batches = (b.to(context.device, non_blocking=True) for b in batches)  # (pinned, ahead)

        summary = train(
            context, model, batches, optimizer, callbacks=callbacks, lr_scheduler=lr_scheduler, start_step=start_step
        )
        last_step = start_step + summary.steps
        _check_pairs_trained(model, context.inputs.heads, summary.steps)
        callbacks.on_train_end(last_step)
        # The time of work outside the steps is read after the final evaluation, which it includes.
        final = run_io.finish(summary.as_json(), lambda: {**callbacks.result(), **context.other_work.as_json()})
    finally:
        checkpoints.close()
    if context.rank == 0:
        console.result(final)
    return 0  # run() closes the process group, where this frame's model is gone


def build_context(options: TrainOptions, module: ModuleType) -> RunContext:
    """The run's context (runtime.train.context): `options` with the spec's defaults, `module`'s
    configs, and this rank's process group, joined here when torchrun started several ranks."""
    device_kind = module.INPUTS.device
    training = module.INPUTS.training
    check_precision(training.precision, device_kind, where=training.precision_where)  # this rank's CPU
    process_group = init_distributed(device_kind)
    kernel_choices.share(process_group)
    return RunContext(
        options=options,
        inputs=module.INPUTS,
        spec_sha256=module.SPEC_SHA256,
        plan=module.PLAN,
        process_group=process_group,
        rank=dist.get_rank() if process_group is not None else 0,
        world_size=dist.get_world_size() if process_group is not None else 1,
        device=torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else None,
    )


def _warn_on_rank_0(context: RunContext) -> Callable[[str], None]:
    def warn(line: str) -> None:
        if context.rank == 0:
            console.say(line, sys.stderr)

    return warn


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
