"""Tests for runtime/modules/blocks/hstu.py, against a per-sample loop written from the formula."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from sequence_inputs import padded_batch

from runtime.modules.blocks.hstu import HSTU, hstu_layers, time_buckets
from runtime.modules.layers.dropout import keep_mask

DIM, HEADS, ATTN, LIN, MAX_LEN, BUCKETS = 8, 2, 3, 4, 7, 16


def bucket(delta: int) -> int:
    return min(max(math.floor(math.log(max(abs(delta), 1)) / 0.301), 0), BUCKETS)


def layer_norm(v: torch.Tensor) -> torch.Tensor:
    mean = v.mean()
    return (v - mean) / torch.sqrt(((v - mean) ** 2).mean() + 1e-6)


def loop_reference(
    block: HSTU, x: torch.Tensor, lengths: torch.Tensor, ts: torch.Tensor, gate_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Sample by sample, position by position, head by head; `gate_scale` [B, L, H*LIN] multiplies the gate."""
    out = torch.zeros_like(x)
    for b, n in enumerate(lengths.tolist()):
        sizes = (HEADS * LIN, HEADS * LIN, HEADS * ATTN, HEADS * ATTN)
        u, v, q, k = [], [], [], []
        for i in range(n):
            for part, row in zip((u, v, q, k), torch.split(F.silu(block.uvqk @ layer_norm(x[b, i])), sizes)):
                part.append(row)
        for i in range(n):
            heads = []
            for h in range(HEADS):
                qh = q[i][h * ATTN : (h + 1) * ATTN]
                total = torch.zeros(LIN)
                for j in range(i + 1):
                    kh = k[j][h * ATTN : (h + 1) * ATTN]
                    rab = (
                        block.position_bias[MAX_LEN - 1 + j - i]
                        + block.time_bias[bucket(int(ts[b, i]) - int(ts[b, j]))]
                    )
                    weight = F.silu(qh @ kh + rab) / MAX_LEN
                    total = total + weight * v[j][h * LIN : (h + 1) * LIN]
                heads.append(total)
            gated = layer_norm(torch.cat(heads)) * u[i]
            if gate_scale is not None:
                gated = gated * gate_scale[b, i]
            out[b, i] = block.output.weight @ gated + block.output.bias + x[b, i]
    return out


def timestamps(lengths: list[int], length: int) -> torch.Tensor:
    """Increasing times with gaps from seconds to days; padding holds junk."""
    gen = torch.Generator().manual_seed(3)
    gaps = torch.randint(0, 200_000, (len(lengths), length), generator=gen)
    return gaps.cumsum(1) + 1_600_000_000


def test_matches_the_loop_reference_and_padding_is_zero() -> None:
    torch.manual_seed(0)
    block = HSTU(DIM, HEADS, ATTN, LIN, MAX_LEN, BUCKETS)
    with torch.no_grad():  # larger biases than the init's, so they matter in the comparison
        block.position_bias.normal_()
        block.time_bias.normal_()
    x, lengths = padded_batch(DIM)
    ts = timestamps(lengths.tolist(), x.shape[1])
    out = block(x, lengths, ts)
    torch.testing.assert_close(out, loop_reference(block, x, lengths, ts), atol=1e-5, rtol=0)


def test_gradients_match_the_loop_reference() -> None:
    torch.manual_seed(1)
    block = HSTU(DIM, HEADS, ATTN, LIN, MAX_LEN, BUCKETS)
    x, lengths = padded_batch(DIM, lengths=[2, 5])
    ts = timestamps(lengths.tolist(), 6)
    block(x, lengths, ts).square().sum().backward()
    ours = {name: p.grad.clone() for name, p in block.named_parameters()}
    block.zero_grad()
    loop_reference(block, x, lengths, ts).square().sum().backward()
    for name, param in block.named_parameters():
        torch.testing.assert_close(ours[name], param.grad, atol=1e-5, rtol=0, msg=name)


def test_causal_a_later_position_does_not_change_earlier_outputs() -> None:
    block = HSTU(DIM, HEADS, ATTN, LIN, MAX_LEN, BUCKETS)
    x, lengths = padded_batch(DIM, lengths=[6])
    ts = timestamps([6], 6)
    changed = x.clone()
    changed[0, 5] += 1.0
    torch.testing.assert_close(block(x, lengths, ts)[0, :5], block(changed, lengths, ts)[0, :5], atol=0, rtol=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: HSTU(DIM, HEADS, ATTN, LIN, 4)(*padded_batch(DIM), torch.zeros(5, 6)),
            "HSTU: a padded length of 6 exceeds max_length 4",
        ),
        (
            lambda: HSTU(DIM, HEADS, ATTN, LIN, MAX_LEN)(*padded_batch(DIM), torch.zeros(5, 5)),
            "HSTU: expected timestamps of shape (5, 6), got (5, 5)",
        ),
        (lambda: HSTU(DIM, 0, ATTN, LIN, MAX_LEN), "HSTU: num_heads must be an integer >= 1 (got 0)"),
        (
            lambda: HSTU(DIM, HEADS, ATTN, LIN, MAX_LEN)(torch.zeros(5, 6), torch.zeros(5), torch.zeros(5, 6)),
            "HSTU: expected a sequence of shape (B, L, 8), got (5, 6)",
        ),
    ],
)
def test_errors_name_the_block(call, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def test_hstu_layers_are_independent_layers_of_the_same_sizes() -> None:
    torch.manual_seed(0)
    layers = hstu_layers(2, dim=8, num_heads=2, attention_dim=4, linear_dim=4, max_length=5, num_buckets=16)
    assert [type(layer).__name__ for layer in layers] == ["HSTU", "HSTU"]
    assert not torch.equal(layers[0].uvqk, layers[1].uvqk)
    assert layers[1].extra_repr() == (
        "dim=8, num_heads=2, attention_dim=4, linear_dim=4, max_length=5, num_buckets=16, dropout=0.0, "
        "scale_input=False, positions=False, input_dropout=0.0"
    )
    with pytest.raises(ValueError, match=r"^hstu_layers: num_layers must be"):
        hstu_layers(0, dim=8, num_heads=2, attention_dim=4, linear_dim=4, max_length=5)


def plain_time_buckets(ts: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """The bucket formula on the int64 differences, as the block computed it before it saved bytes."""
    delta = (ts.unsqueeze(2) - ts.unsqueeze(1)).abs().clamp(min=1)
    return (delta.to(torch.float32).log() / 0.301).floor().long().clamp(0, num_buckets)


@pytest.mark.parametrize("span", [2**30 - 1, 2**30, 2**40], ids=["int32", "just-int64", "int64"])
def test_time_buckets_are_the_formulas_whether_the_differences_fit_int32_or_not(span: int) -> None:
    gen = torch.Generator().manual_seed(4)
    # The first differences at which each bucket starts, one below and one above, beside random ones.
    starts = [math.ceil(math.exp(0.301 * k)) for k in range(1, 70)]
    near = torch.tensor([d + s for d in starts for s in (-1, 0, 1) if d + s < span])
    ts = torch.randint(0, span, (3, 40), generator=gen) + 1_700_000_000
    ts[:, 0] = 1_700_000_000
    ts[:, 1] = 1_700_000_000 + span
    ts[0, 2 : 2 + near.numel()] = 1_700_000_000 + near[:38]
    buckets = time_buckets(ts, 128)
    assert buckets.dtype == torch.int64
    assert torch.equal(buckets, plain_time_buckets(ts, 128))
    assert int(buckets.max()) == math.floor(math.log(span) / 0.301)


def test_input_preprocessor_and_dropout_follow_generative_recommenders() -> None:
    """sqrt(d) scaling, learned positions and input dropout before the first layer; dropout on LN(AV) * U."""
    torch.manual_seed(0)
    layers = hstu_layers(
        2,
        scale_input=True,
        positions=True,
        input_dropout=0.2,
        seed=5,
        dim=DIM,
        num_heads=HEADS,
        attention_dim=ATTN,
        linear_dim=LIN,
        max_length=MAX_LEN,
        num_buckets=BUCKETS,
        dropout=0.3,
    )
    assert layers[1].positions is None and not layers[1].scale_input and layers[1].input_dropout == 0.0
    assert layers[0].positions.abs().max() <= 2 * DIM**-0.5
    x, lengths = padded_batch(DIM)
    ts = timestamps(lengths.tolist(), x.shape[1])
    samples = torch.arange(x.shape[0])

    def scale(layer: HSTU, p: float, stream: int, shape: tuple[int, ...]) -> torch.Tensor:
        mask = keep_mask(p, layer.drop.seed, stream, 0, samples, math.prod(shape[1:]))
        return (mask / (1 - p)).view(shape)

    out = x
    for layer in layers:
        out = layer(out, lengths, ts)
    first = layers[0]
    expected = (x * DIM**0.5 + first.positions[: x.shape[1]]) * scale(first, 0.2, 0, x.shape)
    for layer in layers:
        gate = scale(layer, 0.3, 1, (*x.shape[:2], HEADS * LIN))
        expected = loop_reference(layer, expected, lengths, ts, gate)
    real = torch.arange(x.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=0)
    assert layers[0].drop.seed != layers[1].drop.seed
