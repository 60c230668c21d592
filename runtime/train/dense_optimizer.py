"""The dense optimizer: the torch optimizer over a model's dense parameters.

A generated module describes it as a `DenseOptimizerConfig` (its
DENSE_OPTIMIZER constant); embedding tables have their own optimizers, fused
into their kernels (runtime.embeddings.optim.EmbeddingOptimizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

DENSE_OPTIMIZER_TYPES = ("sgd", "adagrad", "adam", "adamw")


@dataclass(frozen=True, slots=True)
class DenseOptimizerConfig:
    """An optimizer and its hyper-parameters; `where` is the spec location it was compiled from."""

    type: str
    lr: float
    eps: float = 1e-8
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    where: str = ""

    def __post_init__(self) -> None:
        if self.type not in DENSE_OPTIMIZER_TYPES:
            at = f" ({self.where})" if self.where else ""
            raise ValueError(f"dense optimizer {self.type!r}{at} is not supported (sgd, adagrad, adam or adamw)")


def make_dense_optimizer(
    config: DenseOptimizerConfig, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """The torch optimizer of `config` over `params`."""
    params = list(params)
    # The fused kernels update all parameters in one pass: on CPU, Adagrad's
    # default per-tensor loop costs ~100x more than its fused form.
    on_cpu = all(p.device.type == "cpu" for p in params)
    if config.type == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay, fused=True)
    if config.type == "adagrad":
        fast = {"fused": True} if on_cpu else {"foreach": True}  # fused Adagrad is CPU-only
        return torch.optim.Adagrad(
            params, lr=config.lr, eps=config.eps, weight_decay=config.weight_decay, **fast
        )
    # adamw: decoupled weight decay (Loshchilov and Hutter), as generative-recommenders trains.
    adam = torch.optim.AdamW if config.type == "adamw" else torch.optim.Adam
    return adam(
        params,
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        weight_decay=config.weight_decay,
        fused=True,
    )
