"""PLE: progressive layered extraction (Tang et al., RecSys 2020), the `moe` block with task experts.

Each extraction layer j = 1..L holds, for every task t, `task_experts`
experts E_{t,i} reading the task's input x_t, and `shared_experts` experts
E_{s,i} reading the shared input x_s (at layer 1 all inputs are the block's
input x). Customised gate control:

    x_t' = sum_k softmax(W_t x_t + c_t)_k * [E_{t,1..}(x_t), E_{s,1..}(x_s)]_k
    x_s' = sum_k softmax(W_s x_s + c_s)_k * [E_{1,..}(x_1), ..., E_{T,..}(x_T), E_{s,..}(x_s)]_k

the shared gate existing in every layer but the last. The block's outputs
are the last layer's x_t, one per task. Experts are MLPs with `activation`
after every layer, as MixtureOfExperts' are; with one layer this is CGC.
`per_level` gives each layer its own (shared experts, task experts, expert
layers), as the paper's figure 5 stacks layers of different sizes; layer
j + 1 reads layer j's outputs, as wide as its experts' last layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from runtime.modules.blocks.pooled import MLP, _activation, _check_input
from runtime.modules.layers.arguments import check_layers, check_size, owner
from runtime.modules.layers.linear import Linear

__all__ = ["ExtractionLayer", "ProgressiveLayeredExtraction"]


def _mix(gate: nn.Module, x: torch.Tensor, experts: list[torch.Tensor]) -> torch.Tensor:
    """sum_k softmax(gate(x))_k * experts[k]: (B, H)."""
    weights = torch.softmax(gate(x), dim=1).unsqueeze(1)  # (B, 1, K)
    return torch.bmm(weights, torch.stack(experts, dim=1)).squeeze(1)


class ExtractionLayer(nn.Module):
    """One PLE layer: task and shared experts, a gate per task and (unless `last`) a shared gate."""

    def __init__(
        self,
        in_features: int,
        num_tasks: int,
        task_experts: int,
        shared_experts: int,
        expert_layers: Sequence[int],
        activation: str,
        last: bool,
    ) -> None:
        super().__init__()
        self.num_tasks, self.task_experts = num_tasks, task_experts

        def expert() -> MLP:
            return MLP(in_features, expert_layers, activation, activation)

        self.task = nn.ModuleList(nn.ModuleList(expert() for _ in range(task_experts)) for _ in range(num_tasks))
        self.shared = nn.ModuleList(expert() for _ in range(shared_experts))
        self.task_gates = nn.ModuleList(Linear(in_features, task_experts + shared_experts) for _ in range(num_tasks))
        total = num_tasks * task_experts + shared_experts
        self.shared_gate = None if last else Linear(in_features, total)

    def forward(
        self, tasks: list[torch.Tensor], shared: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        own = [[e(x) for e in experts] for experts, x in zip(self.task, tasks)]
        common = [e(shared) for e in self.shared]
        outputs = [_mix(gate, x, mine + common) for gate, x, mine in zip(self.task_gates, tasks, own)]
        if self.shared_gate is None:
            return outputs, None
        return outputs, _mix(self.shared_gate, shared, [e for mine in own for e in mine] + common)


class ProgressiveLayeredExtraction(nn.Module):
    """`levels` extraction layers; (B, in_features) -> tuple of num_tasks (B, expert_layers[-1])."""

    def __init__(
        self,
        in_features: int,
        shared_experts: int,
        task_experts: int,
        expert_layers: Sequence[int],
        num_tasks: int,
        levels: int = 1,
        activation: str = "relu",
        where: str = "",
        per_level: Sequence[tuple[int, int, Sequence[int]]] = (),
    ) -> None:
        super().__init__()
        self.where = where
        name = owner("ProgressiveLayeredExtraction", where)
        self.in_features = check_size(name, "in_features", in_features)
        self.shared_experts = check_size(name, "shared_experts", shared_experts)
        self.task_experts = check_size(name, "task_experts", task_experts)
        self.expert_layers = check_layers(name, "expert_layers", expert_layers)
        self.num_tasks = check_size(name, "num_tasks", num_tasks)
        self.levels = check_size(name, "levels", levels)
        _activation(name, "activation", activation)
        self.activation = activation
        if per_level and len(per_level) != levels:
            raise ValueError(f"{name}: per_level has {len(per_level)} entries for {levels} levels")
        sizes = [
            (
                check_size(name, f"per_level[{j}] shared experts", shared),
                check_size(name, f"per_level[{j}] task experts", task),
                check_layers(name, f"per_level[{j}] expert_layers", layers),
            )
            for j, (shared, task, layers) in enumerate(per_level)
        ] or [(self.shared_experts, self.task_experts, self.expert_layers)] * levels
        self.per_level = [(shared, task, list(layers)) for shared, task, layers in per_level]
        self.out_features = sizes[-1][2][-1]
        widths = [self.in_features] + [layers[-1] for _, _, layers in sizes[:-1]]
        self.layers = nn.ModuleList(
            ExtractionLayer(w, num_tasks, task, shared, layers, activation, j == levels - 1)
            for j, (w, (shared, task, layers)) in enumerate(zip(widths, sizes))
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _check_input(owner("ProgressiveLayeredExtraction", self.where), x, self.in_features)
        tasks, shared = [x] * self.num_tasks, x
        for layer in self.layers:
            tasks, shared = layer(tasks, shared)
        return tuple(tasks)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, shared_experts={self.shared_experts}, "
            f"task_experts={self.task_experts}, expert_layers={self.expert_layers}, "
            f"num_tasks={self.num_tasks}, levels={self.levels}, activation={self.activation}"
            + (f", per_level={self.per_level}" if self.per_level else "")
        )
