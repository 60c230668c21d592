"""runtime/modules/blocks/field_stack.py: NumericEmbedding against its formula, Flatten's order, their errors."""

from __future__ import annotations

import pytest
import torch

from runtime.modules.blocks.field_stack import Flatten, NumericEmbedding


def test_numeric_embedding_is_each_column_times_its_own_vector_plus_its_offset() -> None:
    torch.manual_seed(0)
    module = NumericEmbedding(size=3, dim=4, bias=True).double()
    with torch.no_grad():
        module.bias.copy_(torch.randn(3, 4, dtype=torch.float64))
    x = torch.randn(5, 3, dtype=torch.float64)
    out = module(x)
    assert out.shape == (5, 3, 4)
    for b in range(5):
        for i in range(3):
            expected = x[b, i] * module.weight[i] + module.bias[i]
            torch.testing.assert_close(out[b, i], expected, rtol=0, atol=1e-15)


def test_numeric_embedding_without_bias_is_zero_at_zero_and_linear_in_the_value() -> None:
    module = NumericEmbedding(size=2, dim=3)
    assert module.bias is None
    x = torch.tensor([[0.0, 2.0]])
    out = module(x)
    torch.testing.assert_close(out[0, 0], torch.zeros(3), rtol=0, atol=0)
    torch.testing.assert_close(out[0, 1], 2.0 * module.weight[1], rtol=0, atol=0)


def test_numeric_embedding_trains_its_vectors() -> None:
    module = NumericEmbedding(size=2, dim=3, bias=True)
    module(torch.ones(4, 2)).sum().backward()
    torch.testing.assert_close(module.weight.grad, torch.full((2, 3), 4.0), rtol=0, atol=0)
    torch.testing.assert_close(module.bias.grad, torch.full((2, 3), 4.0), rtol=0, atol=0)


def test_numeric_embedding_errors_name_the_feature() -> None:
    module = NumericEmbedding(size=3, dim=4, where="spec.yaml:4:7")
    with pytest.raises(ValueError) as caught:
        module(torch.ones(2, 5))
    assert str(caught.value) == "NumericEmbedding (spec.yaml:4:7): expected input of shape (B, 3), got (2, 5)"
    with pytest.raises(ValueError) as caught:
        NumericEmbedding(size=3, dim=4, bias="yes")
    assert str(caught.value) == "NumericEmbedding: bias must be true or false (got 'yes')"


def test_flatten_puts_field_after_field() -> None:
    x = torch.arange(24.0).view(2, 3, 4)
    out = Flatten(num_fields=3, dim=4)(x)
    torch.testing.assert_close(out, torch.cat([x[:, 0], x[:, 1], x[:, 2]], dim=1), rtol=0, atol=0)
    with pytest.raises(ValueError) as caught:
        Flatten(num_fields=3, dim=4)(torch.ones(2, 12))
    assert str(caught.value) == "Flatten: expected a field stack of shape (B, 3, 4), got (2, 12)"
