"""Sparse optimizers for embedding tables, in plain torch.

`EmbeddingOptimizer` (runtime.config.embeddings) is the one config both kernels of
`runtime.embeddings.bag_collection.EmbeddingBagCollection` read. The fused kernel hands it to
fbgemm's TBE, which applies the update inside its backward; the dense kernel
(and the fused kernel where fbgemm has no CPU implementation: Adam) applies
`apply_update` from a post-accumulate-grad hook. The formulas here are those
of fbgemm's exact CPU kernels (`codegen/genscript/optimizers.py`), applied to
the rows touched in the step only, each with its gradient summed over every
occurrence of the row in the batch:

    sgd              w[r] -= lr * g
    adagrad          m1[r] += g**2;            w[r] -= lr * g / (sqrt(m1[r]) + eps)
    rowwise_adagrad  m1[r] += mean(g**2);      w[r] -= lr * g / (sqrt(m1[r]) + eps)
    adam             t += 1
                     m1[r] = b1 * m1[r] + (1 - b1) * g
                     m2[r] = b2 * m2[r] + (1 - b2) * g**2
                     w[r] -= lr * (m1[r] / (1 - b1**t) / (sqrt(m2[r] / (1 - b2**t)) + eps)
                                   + weight_decay * w[r])

Adam is fbgemm's "lazy" Adam: rows absent from a batch keep their moments
unchanged. Its step counter `t` counts backward passes (fbgemm's CUDA kernel
counts forward calls; the two agree in a training loop).

State names and shapes follow fbgemm's `split_optimizer_states()` so a state
dict moves between the kernels unchanged: `momentum1` (rows x dim for
adagrad and adam, rows for rowwise_adagrad), `momentum2` (rows x dim, adam)
and `iter` (int64, shape (1,), adam).
"""

from __future__ import annotations

import math

import torch

from runtime.config.embeddings import EmbeddingOptimizer


def state_shapes(optimizer: EmbeddingOptimizer, rows: int, dim: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the optimizer state of one rows x dim table, in save order."""
    if optimizer.type == "adagrad":
        return {"momentum1": (rows, dim)}
    if optimizer.type == "rowwise_adagrad":
        return {"momentum1": (rows,)}
    if optimizer.type == "adam":
        return {"momentum1": (rows, dim), "momentum2": (rows, dim), "iter": (1,)}
    return {}


def init_state(
    optimizer: EmbeddingOptimizer, rows: int, dim: int, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """Zero-initialised state of one table (float32; `iter` int64)."""
    return {
        name: torch.zeros(shape, device=device, dtype=torch.int64 if name == "iter" else torch.float32)
        for name, shape in state_shapes(optimizer, rows, dim).items()
    }


@torch.no_grad()
def apply_update(
    optimizer: EmbeddingOptimizer,
    weight: torch.Tensor,
    state: dict[str, torch.Tensor],
    rows: torch.Tensor,
    grad: torch.Tensor,
    lr: float | None = None,
) -> None:
    """Updates `weight` and `state` in place for `rows` (unique) with their summed `grad`.

    `rows` is int64 of shape (n,), `grad` float of shape (n, dim). `lr` is
    this step's learning rate (a schedule's); the optimizer's own by default.
    """
    lr = optimizer.lr if lr is None else lr
    if optimizer.type == "sgd":
        weight.index_add_(0, rows, grad, alpha=-lr)
        return
    if optimizer.type == "adam":
        _adam(optimizer, weight, state, rows, grad, lr)
        return
    momentum1 = state["momentum1"]
    if optimizer.type == "adagrad":
        m1 = momentum1.index_select(0, rows).addcmul_(grad, grad)
        denom = m1.sqrt().add_(optimizer.eps)
    else:
        m1 = momentum1.index_select(0, rows).add_(grad.square().mean(dim=1))
        denom = m1.sqrt().add_(optimizer.eps).unsqueeze(1)
    momentum1.index_copy_(0, rows, m1)
    weight.index_copy_(0, rows, weight.index_select(0, rows).addcdiv_(grad, denom, value=-lr))


def _adam(
    optimizer: EmbeddingOptimizer,
    weight: torch.Tensor,
    state: dict[str, torch.Tensor],
    rows: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
) -> None:
    step = int(state["iter"].add_(1).item())
    b1, b2 = optimizer.beta1, optimizer.beta2
    m1 = state["momentum1"].index_select(0, rows).mul_(b1).add_(grad, alpha=1 - b1)
    m2 = state["momentum2"].index_select(0, rows).mul_(b2).addcmul_(grad, grad, value=1 - b2)
    state["momentum1"].index_copy_(0, rows, m1)
    state["momentum2"].index_copy_(0, rows, m2)
    denom = m2.div_(1 - math.pow(b2, step)).sqrt_().add_(optimizer.eps)
    update = m1.div_(1 - math.pow(b1, step)).div_(denom)
    w = weight.index_select(0, rows)
    update.add_(w, alpha=optimizer.weight_decay)
    weight.index_copy_(0, rows, w.sub_(update, alpha=lr))
