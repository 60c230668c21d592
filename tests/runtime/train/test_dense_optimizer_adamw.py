"""The adamw dense optimizer: torch.optim.AdamW's decoupled weight decay, unlike adam's L2 term."""

from __future__ import annotations

import torch

from runtime.config.training import DenseOptimizerConfig
from runtime.train.dense_optimizer import make_dense_optimizer


def steps(config: DenseOptimizerConfig, reference: type[torch.optim.Optimizer]) -> tuple[torch.Tensor, torch.Tensor]:
    """Three steps of ours and of `reference` from the same weights and gradients."""
    start = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    mine = make_dense_optimizer(config, [ours])
    other = reference(
        [theirs], lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, weight_decay=config.weight_decay
    )
    for step in range(3):
        grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(step + 1))
        for param, optimizer in ((ours, mine), (theirs, other)):
            param.grad = grad.clone()
            optimizer.step()
    return ours.detach(), theirs.detach()


def test_adamw_decays_the_weights_apart_from_the_gradient() -> None:
    config = DenseOptimizerConfig("adamw", lr=0.01, weight_decay=0.1, beta2=0.98)
    ours, adamw = steps(config, torch.optim.AdamW)
    torch.testing.assert_close(ours, adamw, atol=1e-6, rtol=0)
    _, adam = steps(DenseOptimizerConfig("adam", lr=0.01, weight_decay=0.1, beta2=0.98), torch.optim.Adam)
    assert not torch.allclose(ours, adam, atol=1e-4)  # the L2 term of adam moves the weights otherwise
