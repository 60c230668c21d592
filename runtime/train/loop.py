"""The plain training loop.

Embedding tables update themselves in backward (their optimizer is fused
into the embedding kernels), so the loop only steps the dense optimizer over
`model.dense_parameters()` (runtime/train/dense_optimizer.py makes it). A
learning-rate schedule sets both kinds of rates before each step
(runtime/train/lr_scheduler.py).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from runtime.data.batch import Batch
from runtime.reporting.monitor import StepLog
from runtime.train.callbacks import Callback
from runtime.train.context import RunContext
from runtime.train.dense_optimizer import step as step_dense
from runtime.train.lr_scheduler import LrScheduler
from runtime.train.precision import autocast
from runtime.train.train_pipeline import TrainPipeline


@dataclass(frozen=True)
class TrainSummary:
    steps: int
    samples_per_s: float | None  # training steps only (the first, warm-up, left out): None after one step
    losses: tuple[float, ...]  # global mean loss per step

    def as_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "samples_per_s": None if self.samples_per_s is None else round(self.samples_per_s, 1),
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
        }


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, precision: str = "fp32"
) -> torch.Tensor:
    """One step of forward, loss, backward and dense optimizer; returns the detached local loss.

    The embedding tables are updated inside backward by their fused optimizer. `precision`
    bf16: the dense layers compute in bf16 (runtime.train.precision), fp32 weights.
    """
    return train_step_outputs(model, optimizer, batch, precision)[0]


def train_step_outputs(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, precision: str = "fp32"
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`train_step`, also returning the heads' detached outputs (what metrics need)."""
    with autocast(precision):
        outputs = model(batch.dense, batch.sparse)
        loss = model.loss(outputs, batch.labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    step_dense(optimizer)
    return loss.detach(), {name: output.detach() for name, output in outputs.items()}


def train(
    context: RunContext,
    model: torch.nn.Module,
    batches: Iterator[Batch],
    optimizer: torch.optim.Optimizer,
    *,
    callbacks: Callback | None = None,
    lr_scheduler: LrScheduler | None = None,
    start_step: int = 0,
) -> TrainSummary:
    """Train up to `context.steps`, from `start_step` (steps already done: a resumed run); the global losses.

    The context gives the rest: the global batch, `log_every`, the process group, the pipeline's
    depth and device, the dense layers' precision, and `other_work`, what the hooks measured as
    evaluation or checkpoint saving, which samples/s leaves out. A pipeline depth > 1 trains
    through runtime.train.train_pipeline.TrainPipeline (same losses, the next batch's input_dist
    overlapped), which copies batches to the device; exactly the steps' batches are taken from
    `batches` either way.

    `callbacks` (runtime.train.callbacks) run on every rank: `on_step_end` after every step,
    `on_log` every `log_every` steps and the last, then `should_stop`; when it says yes, that
    step is logged and is the last. Steps are numbered on from `start_step`, and the summary
    covers the steps run here.

    `lr_scheduler`: sets the dense and embedding learning rates before each step
    from the number of steps completed, so a resumed run keeps its schedule; the
    log entries carry the rate.
    """
    hooks = callbacks if callbacks is not None else Callback()
    steps, global_batch, group = context.steps, context.global_batch, context.process_group
    other = context.other_work
    model.train()
    local_losses: list[torch.Tensor] = []
    started = time.perf_counter()
    timed_from = started  # the first step warms up and is left out of samples/s
    other_before = other.total()  # other work before timed_from
    # A run resumed from one that had stopped early (its tracker's state says stop) trains no step.
    last = start_step if start_step < steps and hooks.should_stop() else steps
    run_step = _step_runner(
        model, optimizer, batches, last - start_step, context.pipeline_depth, context.device, context.precision
    )

    def log(step: int, loss: torch.Tensor, now: float) -> None:
        training_seconds = now - timed_from - (other.total() - other_before)
        rate = _rate(global_batch, step - start_step - 1, training_seconds)
        hooks.on_log(StepLog(step, _global_mean(loss, group), rate, *_rates(lr_scheduler)))

    for step in range(start_step + 1, last + 1):
        if lr_scheduler is not None:
            lr_scheduler.start_step(step - 1)
        batch, loss, outputs = run_step()
        local_losses.append(loss)
        hooks.on_step_end(step, batch, outputs, loss)
        now = time.perf_counter()
        if step == start_step + 1:
            timed_from, other_before = now, other.total()
        logged = step % context.log_every == 0 or step == steps
        if logged:
            log(step, loss, now)
        # Asked after the log step, whose hook may evaluate; a stopping step is logged too.
        if step < steps and hooks.should_stop():
            if not logged:
                log(step, loss, now)
            last = step
            break
    elapsed = time.perf_counter() - timed_from - (other.total() - other_before)
    losses = _global_mean(torch.stack(local_losses), group) if local_losses else []
    return TrainSummary(
        steps=last - start_step,
        samples_per_s=_rate(global_batch, last - start_step - 1, elapsed),
        losses=tuple(losses) if isinstance(losses, list) else (losses,),
    )


def _step_runner(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[Batch],
    steps: int,
    depth: int,
    device: torch.device | None,
    precision: str = "fp32",
) -> Callable[[], tuple[Batch, torch.Tensor, dict[str, torch.Tensor]]]:
    """One training step per call: (its batch, local loss, outputs), plain or pipelined.

    The loss includes the tables' `embedding_l2` penalty (runtime/embeddings/l2_penalty.py), whose gradient
    the lookup applied: the logged loss is the objective trained.
    """
    penalized: list[Any] = [m for m in model.modules() if hasattr(m, "logged_penalty")]

    def with_penalty(loss: torch.Tensor) -> torch.Tensor:
        penalties = [p for m in penalized if (p := m.logged_penalty()) is not None]
        return loss + torch.stack(penalties).sum() if penalties else loss

    if depth == 1:

        def plain() -> tuple[Batch, torch.Tensor, dict[str, torch.Tensor]]:
            batch = next(batches)
            loss, outputs = train_step_outputs(model, optimizer, batch, precision)
            return batch, with_penalty(loss), outputs

        return plain
    pipeline = TrainPipeline(model, optimizer, device=device, depth=depth)
    source = itertools.islice(batches, steps)  # the pipeline reads no batch beyond the last step

    def pipelined() -> tuple[Batch, torch.Tensor, dict[str, torch.Tensor]]:
        with autocast(precision):  # the pipeline's forward; its backward runs in the forward's dtypes anyway
            loss, outputs = pipeline.progress(source)
        assert pipeline.last_batch is not None
        return pipeline.last_batch, with_penalty(loss), outputs

    return pipelined


def _rates(lr_scheduler: LrScheduler | None) -> tuple[float | None, float | None]:
    """(the dense learning rate, the schedule's factor) of the step just run, for the log."""
    if lr_scheduler is None:
        return None, None
    return lr_scheduler.lr, lr_scheduler.scale


def _rate(batch_size: int, steps: int, seconds: float) -> float | None:
    """Samples per second over `steps` timed steps; None when none was timed (a run of one step)."""
    return batch_size * steps / seconds if steps > 0 and seconds > 0 else None


def _global_mean(local: torch.Tensor, process_group: dist.ProcessGroup | None) -> Any:
    """The mean over ranks (every rank holds an equal share of the global batch)."""
    if process_group is not None and dist.get_world_size(process_group) > 1:
        local = local.clone()
        dist.all_reduce(local, group=process_group)
        local /= dist.get_world_size(process_group)
    return local.tolist()
