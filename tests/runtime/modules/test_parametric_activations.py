"""runtime/modules/layers/parametric_activations.py: Dice against DIN's formula, PReLU against torch.nn.PReLU."""

from __future__ import annotations

import torch

from runtime.modules.blocks.pooled import MLP
from runtime.modules.layers.parametric_activations import Dice


def test_dice_is_dins_formula_with_the_batch_statistics_in_training_and_the_running_ones_in_eval() -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 6) * 3 + 1
    dice = Dice(6)
    with torch.no_grad():
        dice.alpha.copy_(torch.randn(6))
    mean, var = x.mean(0), x.var(0, unbiased=False)
    p = torch.sigmoid((x - mean) / torch.sqrt(var + 1e-9))
    torch.testing.assert_close(dice(x), p * x + (1 - p) * dice.alpha * x)
    dice.eval()
    running_mean, running_var = 0.01 * mean, 0.99 + 0.01 * x.var(0, unbiased=True)
    p = torch.sigmoid((x - running_mean) / torch.sqrt(running_var + 1e-9))
    torch.testing.assert_close(dice(x), p * x + (1 - p) * dice.alpha * x)


def test_dice_starts_as_its_gate_times_the_input_and_has_no_affine_normalisation() -> None:
    assert [name for name, _ in Dice(3).named_parameters()] == ["alpha"]


def test_an_mlp_with_prelu_matches_linears_and_torch_prelu() -> None:
    torch.manual_seed(0)
    mlp = MLP(5, [4, 3], activation="prelu", final_activation="prelu")
    with torch.no_grad():
        mlp.parametric["0"].weight.fill_(0.1)
    x = torch.randn(8, 5)
    first, second = mlp.linears
    reference = torch.nn.PReLU(init=0.1)(first(x))
    reference = torch.nn.PReLU()(second(reference))
    torch.testing.assert_close(mlp(x), reference)
    assert sorted(name for name, _ in mlp.named_parameters() if "parametric" in name) == [
        "parametric.0.weight",
        "parametric.1.weight",
    ]


def test_an_mlp_with_dice_has_one_dice_per_hidden_layer_and_a_linear_output() -> None:
    torch.manual_seed(0)
    mlp = MLP(5, [4, 1], activation="dice", final_activation="none")
    x = torch.randn(8, 5)
    first, second = mlp.linears
    h = first(x)
    p = torch.sigmoid((h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + 1e-9))
    torch.testing.assert_close(mlp(x), second(p * h))
    assert list(mlp.parametric) == ["0"]
