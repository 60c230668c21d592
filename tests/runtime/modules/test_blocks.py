"""Tests for runtime/modules/blocks/pooled.py: every block against its formula written out here.

References use explicit loops or einsum in float64, so a disagreement points
at the block, not at a shared helper. Tolerances: 1e-10 in float64, 1e-5
relative in float32.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from runtime.cpu import choice
from runtime.modules.blocks.pooled import (
    BLOCK_TYPES,
    MLP,
    Concat,
    CrossNet,
    DotInteraction,
    DotProduct,
    FactorizationMachine,
    MixtureOfExperts,
    Sum,
)
from runtime.modules.layers.dropout import keep_mask
from runtime.sparse.jagged import KeyedTensor

F64 = {"rtol": 1e-10, "atol": 1e-10}
F32 = {"rtol": 1e-5, "atol": 1e-5}

ACTIVATION_FORMULAS = {
    "relu": lambda v: max(v, 0.0),
    "sigmoid": lambda v: 1.0 / (1.0 + math.exp(-v)),
    "tanh": math.tanh,
    "gelu": lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))),
    "silu": lambda v: v / (1.0 + math.exp(-v)),
    "none": lambda v: v,
}


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---- MLP -----------------------------------------------------------------


def _mlp_reference(mlp: MLP, x: torch.Tensor, hidden: str, final: str) -> torch.Tensor:
    rows = x.tolist()
    for k, linear in enumerate(mlp.linears):
        weight, bias = linear.weight.tolist(), linear.bias.tolist()
        act = ACTIVATION_FORMULAS[final if k == len(mlp.linears) - 1 else hidden]
        rows = [
            [act(sum(w * v for w, v in zip(weight_row, row)) + b) for weight_row, b in zip(weight, bias)]
            for row in rows
        ]
    return torch.tensor(rows, dtype=x.dtype)


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh", "gelu", "silu", "none"])
def test_mlp_matches_formula_for_each_activation(activation: str) -> None:
    torch.manual_seed(0)
    mlp = MLP(5, [7, 4, 3], activation=activation, final_activation="tanh").double()
    x = _randn(6, 5)
    torch.testing.assert_close(mlp(x), _mlp_reference(mlp, x, activation, "tanh"), **F64)


@pytest.mark.parametrize("final", [None, "none"])
def test_mlp_linear_output_is_a_logit(final: str | None) -> None:
    torch.manual_seed(0)
    mlp = MLP(4, [8, 1], final_activation=final).double()
    x = _randn(10, 4)
    out = mlp(x)
    assert out.shape == (10, 1)
    assert (out < 0).any()
    torch.testing.assert_close(out, _mlp_reference(mlp, x, "relu", "none"), **F64)


def test_mlp_relu_after_every_layer_by_default() -> None:
    torch.manual_seed(0)
    mlp = MLP(13, [512, 256, 64]).double()
    x = _randn(4, 13)
    out = mlp(x)
    assert out.shape == (4, 64) and mlp.out_features == 64
    assert (out >= 0).all()
    torch.testing.assert_close(out, _mlp_reference(mlp, x, "relu", "relu"), **F64)


def test_mlp_init_is_nn_linear_default() -> None:
    torch.manual_seed(7)
    mlp = MLP(13, [32, 8])
    torch.manual_seed(7)
    expected = [nn.Linear(13, 32), nn.Linear(32, 8)]
    for got, want in zip(mlp.linears, expected):
        torch.testing.assert_close(got.weight, want.weight, rtol=0, atol=0)
        torch.testing.assert_close(got.bias, want.bias, rtol=0, atol=0)


def test_mlp_gradcheck_with_in_place_activations() -> None:
    torch.manual_seed(0)
    mlp = MLP(6, [5, 4, 2], activation="relu", final_activation="sigmoid").double()
    x = _randn(3, 6).requires_grad_()
    torch.autograd.gradcheck(mlp, (x,))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"in_features": 0, "layers": [4]}, "MLP: in_features must be an integer >= 1 (got 0)"),
        ({"in_features": True, "layers": [4]}, "MLP: in_features must be an integer >= 1 (got True)"),
        ({"in_features": 3, "layers": []}, "MLP: layers must be a non-empty list of sizes (got [])"),
        ({"in_features": 3, "layers": 4}, "MLP: layers must be a non-empty list of sizes (got 4)"),
        ({"in_features": 3, "layers": [4, -4]}, "MLP: layers[1] must be an integer >= 1 (got -4)"),
        ({"in_features": 3, "layers": [2.5]}, "MLP: layers[0] must be an integer >= 1 (got 2.5)"),
        (
            {"in_features": 3, "layers": [4], "activation": "swish"},
            "MLP: unknown activation 'swish' (expected one of: dice, gelu, none, prelu, relu, sigmoid, silu, tanh)",
        ),
        (
            {"in_features": 3, "layers": [4], "final_activation": "softmax"},
            "MLP: unknown final_activation 'softmax' (expected one of: dice, gelu, none, prelu, relu, sigmoid, silu, tanh)",
        ),
    ],
)
def test_mlp_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        MLP(**kwargs)
    assert str(err.value) == message


# ---- DotInteraction --------------------------------------------------------


def _dot_reference(x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    z = x.reshape(x.shape[0], n, d)
    pairs = [torch.einsum("bd,bd->b", z[:, i], z[:, j]) for i in range(n) for j in range(i + 1, n)]
    return torch.cat([z[:, 0], torch.stack(pairs, dim=1)], dim=1)


def test_dot_interaction_dlrm_width_and_values() -> None:
    block = DotInteraction(27, 64)
    assert block.out_features == 415
    x = _randn(8, 27 * 64)
    out = block(x)
    assert out.shape == (8, 415)
    torch.testing.assert_close(out, _dot_reference(x, 27, 64), **F64)


def test_dot_interaction_pair_order_is_row_major_upper_triangle() -> None:
    n, d = 4, 2
    x = _randn(3, n * d)
    z = x.view(3, n, d)
    out = DotInteraction(n, d)(x)
    column = d
    for i in range(n):
        for j in range(i + 1, n):
            torch.testing.assert_close(out[:, column], (z[:, i] * z[:, j]).sum(1), **F64)
            column += 1
    assert column == out.shape[1]


def test_dot_interaction_float32_forward_and_backward_match_autograd_reference() -> None:
    x = _randn(16, 27 * 64, dtype=torch.float32).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    grad = _randn(16, 415, seed=1, dtype=torch.float32)
    out, ref = DotInteraction(27, 64)(x), _dot_reference(x_ref, 27, 64)
    torch.testing.assert_close(out, ref, **F32)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, **F32)


def test_dot_interaction_gradcheck_and_gradgradcheck() -> None:
    block = DotInteraction(5, 3)
    x = _randn(4, 15).requires_grad_()
    assert torch.autograd.gradcheck(block, (x,))
    assert torch.autograd.gradgradcheck(block, (x,))


def test_dot_interaction_non_contiguous_input_and_no_grad() -> None:
    wide = _randn(5, 2 * 12)
    x = wide[:, ::2]
    assert not x.is_contiguous()
    with torch.no_grad():
        out = DotInteraction(4, 3)(x)
    torch.testing.assert_close(out, _dot_reference(x, 4, 3), **F64)
    x = wide[:, ::2].clone().requires_grad_()
    leaf = wide.clone().requires_grad_()
    DotInteraction(4, 3)(leaf[:, ::2]).sum().backward()
    DotInteraction(4, 3)(x).sum().backward()
    torch.testing.assert_close(leaf.grad[:, ::2], x.grad, **F64)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 4),
    num_vectors=st.integers(2, 9),
    dim=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_dot_interaction_property(batch: int, num_vectors: int, dim: int, seed: int) -> None:
    x = _randn(batch, num_vectors * dim, seed=seed).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    out, ref = DotInteraction(num_vectors, dim)(x), _dot_reference(x_ref, num_vectors, dim)
    assert out.shape == (batch, dim + num_vectors * (num_vectors - 1) // 2)
    torch.testing.assert_close(out, ref, **F64)
    grad = _randn(*out.shape, seed=seed + 1)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, **F64)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("path", ["native", "torch"])
def test_dot_interaction_reads_a_keyed_tensors_parts_where_they_lie(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection's table groups come as parts of a KeyedTensor (widths 2 and 3 vectors here): the C
    kernel reads each part, nothing placed in the graph, each part getting its own gradient; the
    float32 output and gradients are the float64 formula's."""
    monkeypatch.setenv(choice.ENV, f"dot={path}")
    bottom = _randn(6, 4, seed=2, dtype=torch.float32).requires_grad_()
    parts = (_randn(6, 8, seed=3, dtype=torch.float32), _randn(6, 12, seed=4, dtype=torch.float32))
    parts = tuple(p.requires_grad_() for p in parts)
    embeddings = KeyedTensor(["a", "b", "c", "d", "e"], [4] * 5, parts)
    out = DotInteraction(6, 4)(bottom, embeddings)
    if path == "native":
        assert {f.name() for f, _ in out.grad_fn.next_functions if f is not None} == {"torch::autograd::AccumulateGrad"}
    x_ref = torch.cat([bottom, *parts], dim=1).detach().double().requires_grad_()
    ref = _dot_reference(x_ref, 6, 4)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    grad = _randn(*out.shape, seed=5, dtype=torch.float32)
    got = torch.autograd.grad(out, (bottom, *parts), grad)
    (want,) = torch.autograd.grad(ref, x_ref, grad.double())
    torch.testing.assert_close(torch.cat(got, dim=1).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("path", ["native", "torch"])
def test_dot_interaction_under_bf16_autocast(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 training: the dense tower's output comes in bf16. The C kernel takes an fp32 copy of it
    and computes in fp32 (the formula on the bf16 values, to fp32 rounding); torch's path takes
    autocast's bf16 products (the formula to bf16's). Either way the bf16 input's gradient is bf16."""
    monkeypatch.setenv(choice.ENV, f"dot={path}")
    bottom = _randn(6, 4, seed=2, dtype=torch.float32).bfloat16().requires_grad_()
    part = _randn(6, 20, seed=3, dtype=torch.float32).requires_grad_()
    with torch.autocast("cpu", torch.bfloat16):
        out = DotInteraction(6, 4)(bottom, KeyedTensor(["a", "b", "c", "d", "e"], [4] * 5, (part,)))
    x_ref = torch.cat([bottom.detach().double(), part.detach().double()], dim=1).requires_grad_()
    ref = _dot_reference(x_ref, 6, 4)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if path == "native" else {"rtol": 2e-2, "atol": 2e-2}
    assert out.dtype == torch.float32  # torch's path concatenates its bf16 products to fp32
    torch.testing.assert_close(out.double(), ref, **tolerance)
    grad = _randn(*out.shape, seed=5, dtype=torch.float32)
    got_bottom, got_part = torch.autograd.grad(out, (bottom, part), grad)
    (want,) = torch.autograd.grad(ref, x_ref, grad.double())
    assert got_bottom.dtype == torch.bfloat16 and got_part.dtype == torch.float32
    torch.testing.assert_close(got_bottom.double(), want[:, :4], rtol=2e-2, atol=2e-2)  # rounded to bf16
    torch.testing.assert_close(got_part.double(), want[:, 4:], **tolerance)


def test_dot_interaction_index_buffers_follow_the_module_but_stay_out_of_state_dict() -> None:
    block = DotInteraction(3, 2)
    assert dict(block.state_dict()) == {}
    assert {name for name, _ in block.named_buffers()} == {"triu_index", "sym_index"}


def test_dot_interaction_rejects_bad_arguments_and_inputs() -> None:
    with pytest.raises(ValueError) as err:
        DotInteraction(1, 64)
    assert str(err.value) == "DotInteraction: num_vectors must be an integer >= 2 (got 1)"
    with pytest.raises(ValueError) as err:
        DotInteraction(27, 0)
    assert str(err.value) == "DotInteraction: dim must be an integer >= 1 (got 0)"
    with pytest.raises(ValueError) as err:
        DotInteraction(27, 64)(torch.zeros(2, 1700))
    assert str(err.value) == "DotInteraction: expected input of shape (B, 1728), got (2, 1700)"


# ---- CrossNet --------------------------------------------------------------


def _cross_reference(x0: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor]) -> torch.Tensor:
    x = x0
    for w, b in zip(weights, biases):
        x = x0 * (torch.einsum("ij,bj->bi", w, x) + b) + x
    return x


def test_crossnet_full_rank_matches_formula() -> None:
    torch.manual_seed(0)
    net = CrossNet(6, num_layers=3).double()
    for layer in net.crosses:  # non-zero biases, so b_l is exercised
        nn.init.normal_(layer.bias)
    x = _randn(5, 6)
    weights = [layer.weight for layer in net.crosses]
    biases = [layer.bias for layer in net.crosses]
    assert net(x).shape == (5, 6)
    torch.testing.assert_close(net(x), _cross_reference(x, weights, biases), **F64)


def test_crossnet_low_rank_matches_formula_with_w_equal_u_v() -> None:
    torch.manual_seed(0)
    net = CrossNet(8, num_layers=2, low_rank=3).double()
    weights, biases = [], []
    for v_layer, u_layer in net.crosses:
        nn.init.normal_(u_layer.bias)
        assert v_layer.weight.shape == (3, 8) and v_layer.bias is None
        assert u_layer.weight.shape == (8, 3)
        weights.append(torch.einsum("ir,rj->ij", u_layer.weight, v_layer.weight))
        biases.append(u_layer.bias)
    x = _randn(4, 8)
    torch.testing.assert_close(net(x), _cross_reference(x, weights, biases), **F64)
    assert sum(p.numel() for p in net.parameters()) == 2 * (3 * 8 + 8 * 3 + 8)


def test_crossnet_init_is_xavier_normal_with_zero_bias() -> None:
    torch.manual_seed(0)
    net = CrossNet(256, num_layers=2)
    for layer in net.crosses:
        assert torch.count_nonzero(layer.bias) == 0
        assert abs(layer.weight.std().item() - math.sqrt(2.0 / (256 + 256))) < 2e-3


def test_crossnet_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError) as err:
        CrossNet(8, num_layers=0)
    assert str(err.value) == "CrossNet: num_layers must be an integer >= 1 (got 0)"
    with pytest.raises(ValueError) as err:
        CrossNet(8, num_layers=2, low_rank=0)
    assert str(err.value) == "CrossNet: low_rank must be an integer >= 1 (got 0)"


# ---- FactorizationMachine ---------------------------------------------------


def test_fm_matches_both_forms_of_the_formula() -> None:
    n, d = 5, 4
    x = _randn(7, n * d)
    out = FactorizationMachine(n, d)(x)
    assert out.shape == (7, 1)
    v = x.view(7, n, d)
    halved = torch.stack(
        [0.5 * sum(v[b, :, k].sum() ** 2 - (v[b, :, k] ** 2).sum() for k in range(d)) for b in range(7)]
    )
    pairwise = torch.stack(
        [sum(torch.dot(v[b, i], v[b, j]) for i in range(n) for j in range(i + 1, n)) for b in range(7)]
    )
    torch.testing.assert_close(out[:, 0], halved, **F64)
    torch.testing.assert_close(out[:, 0], pairwise, **F64)


def test_fm_rejects_wrong_width() -> None:
    with pytest.raises(ValueError) as err:
        FactorizationMachine(3, 4)(torch.zeros(2, 10))
    assert str(err.value) == "FactorizationMachine: expected input of shape (B, 12), got (2, 10)"


# ---- DotProduct, Sum, Concat -----------------------------------------------


def test_dot_product_is_row_wise() -> None:
    a, b = _randn(4, 6, seed=1), _randn(4, 6, seed=2)
    out = DotProduct()(a, b)
    assert out.shape == (4, 1)
    expected = torch.tensor([[sum(a[i, k] * b[i, k] for k in range(6))] for i in range(4)], dtype=a.dtype)
    torch.testing.assert_close(out, expected, **F64)
    with pytest.raises(ValueError) as err:
        DotProduct()(a, b[:, :5])
    assert str(err.value) == "DotProduct: inputs must have the same shape, got [(4, 6), (4, 5)]"


def test_sum_adds_elementwise_and_passes_gradient_to_every_input() -> None:
    xs = [_randn(3, 4, seed=s).requires_grad_() for s in range(4)]
    out = Sum()(*xs)
    torch.testing.assert_close(out, xs[0] + xs[1] + xs[2] + xs[3], **F64)
    (out * 2).sum().backward()
    for x in xs:
        torch.testing.assert_close(x.grad, torch.full_like(x, 2.0), **F64)
    assert Sum()(xs[0]) is xs[0]


def test_sum_rejects_no_inputs_and_shape_mismatch() -> None:
    with pytest.raises(ValueError) as err:
        Sum()()
    assert str(err.value) == "Sum: expected at least 1 input, got 0"
    with pytest.raises(ValueError) as err:
        Sum()(torch.zeros(2, 3), torch.zeros(2, 4))
    assert str(err.value) == "Sum: inputs must have the same shape, got [(2, 3), (2, 4)]"


def test_concat_joins_on_features() -> None:
    a, b = _randn(2, 3, seed=1), _randn(2, 5, seed=2)
    out = Concat()(a, b)
    assert out.shape == (2, 8)
    torch.testing.assert_close(out[:, :3], a, rtol=0, atol=0)
    torch.testing.assert_close(out[:, 3:], b, rtol=0, atol=0)
    with pytest.raises(ValueError) as err:
        Concat()()
    assert str(err.value) == "Concat: expected at least 1 input, got 0"


# ---- MixtureOfExperts ------------------------------------------------------


def test_moe_matches_formula_and_gates_sum_to_one() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(6, num_experts=3, expert_layers=[5, 4], num_tasks=2).double()
    x = _randn(7, 6)
    gates = moe.gate_weights(x)
    assert gates.shape == (7, 2, 3)
    assert (gates >= 0).all()
    torch.testing.assert_close(gates.sum(dim=2), torch.ones(7, 2, dtype=x.dtype), **F64)
    outputs = moe(x)
    assert isinstance(outputs, tuple) and len(outputs) == 2
    for t, (out, gate) in enumerate(zip(outputs, moe.gates)):
        logits = torch.einsum("ei,bi->be", gate.weight, x) + gate.bias
        weights = torch.exp(logits) / torch.exp(logits).sum(dim=1, keepdim=True)
        expected = sum(weights[:, e : e + 1] * moe.experts[e](x) for e in range(3))
        assert out.shape == (7, 4)
        torch.testing.assert_close(out, expected, **F64)
        torch.testing.assert_close(weights, gates[:, t], **F64)


def test_moe_experts_apply_activation_after_every_layer() -> None:
    moe = MixtureOfExperts(4, num_experts=2, expert_layers=[3, 2], num_tasks=1, activation="tanh")
    for expert in moe.experts:
        assert (expert.activation, expert.final_activation) == ("tanh", "tanh")


def test_moe_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError) as err:
        MixtureOfExperts(6, num_experts=0, expert_layers=[4], num_tasks=2)
    assert str(err.value) == "MixtureOfExperts: num_experts must be an integer >= 1 (got 0)"
    with pytest.raises(ValueError) as err:
        MixtureOfExperts(6, num_experts=2, expert_layers=[4], num_tasks=0)
    assert str(err.value) == "MixtureOfExperts: num_tasks must be an integer >= 1 (got 0)"
    with pytest.raises(ValueError) as err:
        MixtureOfExperts(6, num_experts=2, expert_layers=[], num_tasks=1)
    assert str(err.value) == "MixtureOfExperts: expert_layers must be a non-empty list of sizes (got [])"


# ---- registry and printed form ------------------------------------------------


def test_block_types_registry() -> None:
    assert BLOCK_TYPES == {
        "mlp": MLP,
        "dot": DotInteraction,
        "crossnet": CrossNet,
        "fm": FactorizationMachine,
        "dot_product": DotProduct,
        "sum": Sum,
        "concat": Concat,
        "moe": MixtureOfExperts,
    }


def test_extra_repr_shows_config() -> None:
    assert MLP(415, [512, 256, 1], final_activation=None).extra_repr() == (
        "in_features=415, layers=[512, 256, 1], activation=relu, final_activation=none"
    )
    assert DotInteraction(27, 64).extra_repr() == "num_vectors=27, dim=64, out_features=415"
    assert CrossNet(16, 3, low_rank=4).extra_repr() == "in_features=16, num_layers=3, low_rank=4"
    assert FactorizationMachine(27, 64).extra_repr() == "num_vectors=27, dim=64"
    assert MixtureOfExperts(8, 4, [16, 8], 2).extra_repr() == (
        "in_features=8, num_experts=4, expert_layers=[16, 8], num_tasks=2, activation=relu"
    )


# ---- MLP: norm, dropout, residual -------------------------------------------


def _decorated_reference(mlp: MLP, x: torch.Tensor, masks: list[torch.Tensor] | None = None) -> torch.Tensor:
    """h' = shortcut(h) + drop(relu(norm(W h + b))) on the layers with an activation; a linear last layer."""
    count = len(mlp.linears) - (mlp.final_activation == "none")
    for k, linear in enumerate(mlp.linears):
        y = x @ linear.weight.detach().T
        if linear.bias is not None:
            y = y + linear.bias.detach()
        if k >= count:
            x = y
            continue
        if mlp.norm == "layer":
            y = F.layer_norm(y, y.shape[1:], mlp.norms[k].weight, mlp.norms[k].bias)
        elif mlp.norm == "batch":
            mean, var = y.mean(0), y.var(0, unbiased=False)
            y = (y - mean) / torch.sqrt(var + 1e-5) * mlp.norms[k].weight + mlp.norms[k].bias
        y = torch.relu(y)
        if masks is not None:
            y = y * masks[k] / (1 - mlp.dropout)
        if mlp.residual:
            shortcut = mlp.shortcuts[k]
            y = y + (x if isinstance(shortcut, nn.Identity) else x @ shortcut.weight.detach().T)
        x = y
    return x


def _perturb(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("norm", ["layer", "batch"])
@pytest.mark.parametrize("residual", [False, True])
def test_mlp_norm_and_residual_match_formula(norm: str, residual: bool) -> None:
    torch.manual_seed(0)
    mlp = _perturb(MLP(5, [5, 7, 1], final_activation=None, norm=norm, residual=residual).double())
    x = _randn(9, 5)
    assert len(mlp.norms) == 2
    # the layers batch norm follows have no bias (it would cancel it); the linear last layer keeps its own
    assert [layer.bias is None for layer in mlp.linears] == [norm == "batch"] * 2 + [False]
    torch.testing.assert_close(mlp(x), _decorated_reference(mlp, x), **F64)


def test_mlp_dropout_masks_are_keyed_by_layer_and_step() -> None:
    torch.manual_seed(0)
    mlp = MLP(4, [6, 3], dropout=0.4, seed=11, residual=True).double()
    x = _randn(8, 4)
    for step in range(2):
        masks = [keep_mask(0.4, 11, k, step, torch.arange(8), w).double() for k, w in enumerate([6, 3])]
        torch.testing.assert_close(mlp(x), _decorated_reference(mlp, x, masks), **F64)
    mlp.eval()
    torch.testing.assert_close(mlp(x), _decorated_reference(mlp, x), **F64)


def test_mlp_batch_norm_gradcheck() -> None:
    torch.manual_seed(0)
    mlp = MLP(3, [4, 2], norm="batch", residual=True).double()
    x = _randn(5, 3).requires_grad_()
    torch.autograd.gradcheck(mlp, (x,))


def test_mlp_defaults_add_no_modules() -> None:
    keys = ["linears.0.weight", "linears.0.bias", "linears.1.weight", "linears.1.bias"]
    assert list(MLP(3, [4, 2]).state_dict()) == keys


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"norm": "group"}, "MLP: unknown norm 'group' (expected one of: batch, layer, none)"),
        ({"dropout": 1.0}, "MLP: dropout must be a number in [0, 1) (got 1.0)"),
        ({"dropout": -0.1}, "MLP: dropout must be a number in [0, 1) (got -0.1)"),
        ({"residual": "yes"}, "MLP: residual must be true or false (got 'yes')"),
        (
            {"layers": [1], "final_activation": None, "norm": "layer"},
            "MLP: norm, dropout and residual apply to the layers followed by an activation, "
            "and the only layer has final_activation none",
        ),
    ],
)
def test_mlp_rejects_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        MLP(**{"in_features": 3, "layers": [4], **kwargs})
    assert str(err.value) == message
