"""ProgressiveLayeredExtraction against PLE's formula (Tang et al., RecSys 2020) on random inputs."""

from __future__ import annotations

import re

import pytest
import torch

from runtime.modules.blocks.ple import ProgressiveLayeredExtraction

F64 = {"rtol": 1e-10, "atol": 1e-10}


def _expert(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """relu after every layer: x -> relu(W x + b), layer by layer."""
    for layer in mlp.linears:
        x = torch.relu(x @ layer.weight.T + layer.bias)
    return x


def _gate(gate: torch.nn.Module, x: torch.Tensor, experts: list[torch.Tensor]) -> torch.Tensor:
    weights = torch.softmax(x @ gate.weight.T + gate.bias, dim=1)
    return sum(weights[:, k : k + 1] * e for k, e in enumerate(experts))


def _reference(ple: ProgressiveLayeredExtraction, x: torch.Tensor) -> list[torch.Tensor]:
    """x_t' = gate_t(x_t) . [E_t(x_t), E_s(x_s)];  x_s' = gate_s(x_s) . [E_1(x_1) .. E_T(x_T), E_s(x_s)]."""
    tasks, shared = [x] * ple.num_tasks, x
    for layer in ple.layers:
        own = [[_expert(e, xt) for e in experts] for experts, xt in zip(layer.task, tasks)]
        common = [_expert(e, shared) for e in layer.shared]
        new_tasks = [_gate(g, xt, mine + common) for g, xt, mine in zip(layer.task_gates, tasks, own)]
        if layer.shared_gate is not None:
            shared = _gate(layer.shared_gate, shared, [e for mine in own for e in mine] + common)
        tasks = new_tasks
    return tasks


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_ple_matches_the_formula(levels: int) -> None:
    torch.manual_seed(levels)
    ple = ProgressiveLayeredExtraction(
        6, shared_experts=2, task_experts=3, expert_layers=[5, 4], num_tasks=2, levels=levels
    ).double()
    x = torch.randn(7, 6, dtype=torch.float64)
    got = ple(x)
    assert len(got) == 2 and all(t.shape == (7, 4) for t in got)
    for out, expected in zip(got, _reference(ple, x)):
        torch.testing.assert_close(out, expected, **F64)


def test_ple_layers_hold_task_and_shared_experts_and_gates() -> None:
    ple = ProgressiveLayeredExtraction(6, shared_experts=1, task_experts=2, expert_layers=[4], num_tasks=3, levels=2)
    first, last = ple.layers
    assert [len(experts) for experts in first.task] == [2, 2, 2] and len(first.shared) == 1
    assert [g.weight.shape for g in first.task_gates] == [torch.Size([3, 6])] * 3  # 2 own + 1 shared experts
    assert first.shared_gate is not None and first.shared_gate.weight.shape == (7, 6)  # 3 x 2 + 1 experts
    assert last.shared_gate is None and last.task_gates[0].weight.shape == (3, 4)  # reads layer 1's 4-wide outputs


def test_ple_gradients_reach_every_expert_and_gate() -> None:
    torch.manual_seed(0)
    ple = ProgressiveLayeredExtraction(5, shared_experts=1, task_experts=1, expert_layers=[4], num_tasks=2, levels=2)
    sum(out.sum() for out in ple(torch.randn(8, 5))).backward()
    missing = [name for name, p in ple.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_ple_rejects_bad_arguments_and_inputs() -> None:
    message = "ProgressiveLayeredExtraction (x.yaml:3:5): levels must be an integer >= 1 (got 0)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ProgressiveLayeredExtraction(4, 1, 1, [4], 2, levels=0, where="x.yaml:3:5")
    ple = ProgressiveLayeredExtraction(4, 1, 1, [4], 2)
    with pytest.raises(ValueError, match=r"expected input of shape \(B, 4\), got \(2, 3\)"):
        ple(torch.randn(2, 3))


def test_ple_levels_of_different_sizes_match_the_formula() -> None:
    torch.manual_seed(0)
    per_level = [(3, 2, [8, 5]), (1, 1, [4]), (2, 3, [6, 3])]
    ple = ProgressiveLayeredExtraction(
        6, shared_experts=9, task_experts=9, expert_layers=[9], num_tasks=2, levels=3, per_level=per_level
    ).double()
    sizes = [
        (len(layer.shared), len(layer.task[0]), [m.out_features for m in layer.shared[0].linears])
        for layer in ple.layers
    ]
    assert sizes == per_level and ple.out_features == 3
    assert [layer.task_gates[0].weight.shape[1] for layer in ple.layers] == [6, 5, 4]  # each reads the last widths
    x = torch.randn(7, 6, dtype=torch.float64)
    for out, expected in zip(ple(x), _reference(ple, x)):
        assert out.shape == (7, 3)
        torch.testing.assert_close(out, expected, **F64)
    message = "ProgressiveLayeredExtraction: per_level has 2 entries for 3 levels"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ProgressiveLayeredExtraction(6, 1, 1, [4], 2, levels=3, per_level=per_level[:2])
