"""The dense optimizer: the torch optimizer over a model's dense parameters.

A generated module describes it as a `DenseOptimizerConfig` (runtime.config.training; its
DENSE_OPTIMIZER constant); embedding tables have their own optimizers, fused
into their kernels (runtime.config.embeddings.EmbeddingOptimizer).

The training loops step it through `step`, which runs the step on one thread
where that measured faster than torch's team (runtime/cpu/choice.py, kernel
'dense_step'). torch's fused CPU optimizers open one OpenMP region per
parameter and split even a bias of 64 values over the team: dlrm-bench's 12
dense parameters make 11 of a criteo step's 59 regions, for about 0.25 ms of
work. Each region needs the second thread, asleep since the backward ended or
preempted by a neighbour, and the tensors come from memory, not the caches:
in dlrm-bench's own steps on the loaded 2-core Zen 4, alternated step by step,
the optimizer took 2.05 ms on 2 threads against 0.89 ms on one (medians of
100 each). Timed back to back on hot tensors the team wins instead, so the
measurement recreates a step's conditions (`_timed_runs`). The update is
elementwise, so both give the same values; the measurement steps a twin
(`twin_of`), never the real parameters.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping

import torch

from runtime.config.training import DenseOptimizerConfig
from runtime.cpu import choice


def make_dense_optimizer(config: DenseOptimizerConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The torch optimizer of `config` over `params`, which may be none: a model of tables alone
    (matrix factorisation) trains them in their own optimizers, and steps an empty group here."""
    params = list(params)
    groups = [{"params": params}]  # torch refuses an empty list of parameters, not an empty group
    # The fused kernels update all parameters in one pass: on CPU, Adagrad's
    # default per-tensor loop costs ~100x more than its fused form.
    on_cpu = all(p.device.type == "cpu" for p in params)
    if config.type == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, weight_decay=config.weight_decay, fused=True)
    if config.type == "adagrad":
        fast = {"fused": True} if on_cpu else {"foreach": True}  # fused Adagrad is CPU-only
        return torch.optim.Adagrad(groups, lr=config.lr, eps=config.eps, weight_decay=config.weight_decay, **fast)
    # adamw: decoupled weight decay (Loshchilov and Hutter), as generative-recommenders trains.
    adam = torch.optim.AdamW if config.type == "adamw" else torch.optim.Adam
    return adam(
        groups,
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        weight_decay=config.weight_decay,
        fused=True,
    )


def step(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.step()`, on one thread where that is the faster (see the module docstring)."""
    threads = torch.get_num_threads()
    if (
        threads > 1
        and _on_cpu(optimizer)
        and choice.choose("dense_step", _shape(optimizer, threads), lambda: _timed_runs(optimizer, threads)) == "one"
    ):
        _step_on(optimizer, 1, threads)
    else:
        optimizer.step()


def _on_cpu(optimizer: torch.optim.Optimizer) -> bool:
    return all(p.device.type == "cpu" for group in optimizer.param_groups for p in group["params"])


def _with_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def _shape(optimizer: torch.optim.Optimizer, threads: int) -> str:
    """The optimizer, how many parameters it steps and their values (bucketed), and the threads."""
    stepped = _with_grads(optimizer)
    values = sum(p.numel() for p in stepped)
    return f"{type(optimizer).__name__.lower()}_tensors{len(stepped)}_values{choice.bucket(values)}_t{threads}"


def _step_on(optimizer: torch.optim.Optimizer, threads: int, restore: int) -> None:
    torch.set_num_threads(threads)  # this thread's OpenMP team, and torch's setting, put back after
    try:
        optimizer.step()
    finally:
        torch.set_num_threads(restore)


# Each timed step starts as a training step's does, untimed: its tensors out of the caches (this
# many bytes written first: more than an L2 and a Zen 4 CCD's 32 MiB L3, as the backward's GEMMs
# and table rows leave them) and the team idle for a moment (the backward's return and `zero_grad`).
EVICT_BYTES = 48 << 20
IDLE_SECONDS = 1e-4


def _timed_runs(optimizer: torch.optim.Optimizer, threads: int) -> Mapping[str, Callable[[], object]]:
    """Both ways on a twin, each step timed alone after `EVICT_BYTES` and `IDLE_SECONDS`."""
    twin = twin_of(optimizer)
    scratch = torch.empty(EVICT_BYTES // 4)

    def on(count: int) -> Callable[[], object]:
        def run() -> choice.Timed:
            scratch.fill_(1.0)
            time.sleep(IDLE_SECONDS)
            start = time.perf_counter()
            _step_on(twin, count, threads)
            return choice.Timed((time.perf_counter() - start) * 1e3)

        return run

    return {"team": on(threads), "one": on(1)}


def twin_of(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A deep copy of `optimizer` with copies of its parameters' gradients, to time steps on:
    stepping it leaves the real parameters and state as they were."""
    twin = copy.deepcopy(optimizer)  # copies no gradient
    for group, twin_group in zip(optimizer.param_groups, twin.param_groups, strict=True):
        for p, twin_p in zip(group["params"], twin_group["params"], strict=True):
            twin_p.grad = None if p.grad is None else p.grad.detach().clone()
    return twin
