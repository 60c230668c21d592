"""The dense optimizer: the torch optimizer over a model's dense parameters.

A generated module describes it as a `DenseOptimizerConfig` (runtime.config.training; its
DENSE_OPTIMIZER constant); embedding tables have their own optimizers, fused
into their kernels (runtime.config.embeddings.EmbeddingOptimizer).
"""

from __future__ import annotations

from typing import Iterable

import torch

from runtime.config.training import DenseOptimizerConfig


def make_dense_optimizer(config: DenseOptimizerConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The torch optimizer of `config` over `params`."""
    params = list(params)
    # The fused kernels update all parameters in one pass: on CPU, Adagrad's
    # default per-tensor loop costs ~100x more than its fused form.
    on_cpu = all(p.device.type == "cpu" for p in params)
    if config.type == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay, fused=True)
    if config.type == "adagrad":
        fast = {"fused": True} if on_cpu else {"foreach": True}  # fused Adagrad is CPU-only
        return torch.optim.Adagrad(params, lr=config.lr, eps=config.eps, weight_decay=config.weight_decay, **fast)
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
