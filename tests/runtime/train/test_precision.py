"""bf16 training (runtime.train.precision): refused without native bf16, and numerics with the check forced.

torch's CPU autocast computes bf16 on any x86 CPU (emulated where the CPU lacks it), so the numerics
are testable everywhere; the capability check takes the flags it is given.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from compiler import cli
from runtime.cpu import features
from runtime.data.batch import Batch
from runtime.modules.layers.linear import Linear, linear
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.train.loop import train_step
from runtime.train.precision import PrecisionError, autocast, bf16_supported, check_precision

AVX2_ONLY = ("sse4.2", "avx", "avx2", "fma", "f16c")
WITH_BF16 = (*AVX2_ONLY, "avx512f", "avx512bw", "avx512vl", "avx512bf16")


def test_bf16_is_refused_on_a_cpu_without_bf16_arithmetic() -> None:
    assert not bf16_supported(AVX2_ONLY) and bf16_supported(WITH_BF16) and bf16_supported(("amx-bf16",))
    with pytest.raises(PrecisionError) as refused:
        check_precision("bf16", flags=AVX2_ONLY)
    assert str(refused.value) == (
        "training precision bf16 needs a CPU with bf16 arithmetic (avx512bf16, amx-bf16, bf16); "
        f"this one ({features.model()}) has none: train in fp32"
    )
    check_precision("bf16", flags=WITH_BF16)  # accepted
    check_precision("fp32", flags=AVX2_ONLY)
    check_precision("bf16", device="cuda", flags=AVX2_ONLY)  # a GPU's bf16 is not the CPU's to judge
    with pytest.raises(PrecisionError, match=r"^training precision 'fp16' is not one of fp32, bf16$"):
        check_precision("fp16")


def test_under_bf16_the_dense_products_compute_in_bf16_from_fp32_weights() -> None:
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(64, 48, generator=gen), torch.randn(40, 48, generator=gen)  # oneDNN-sized in fp32
    with autocast("bf16"):
        got = linear(x, weight)
    assert got.dtype == torch.bfloat16 and weight.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x.bfloat16(), weight.bfloat16()))
    with autocast("fp32"):
        assert linear(x, weight).dtype == torch.float32


class _Tiny(torch.nn.Module):
    """A two-layer MLP with the generated model's calling convention (dense, sparse) and loss."""

    def __init__(self) -> None:
        super().__init__()
        self.bottom, self.top = Linear(8, 16), Linear(16, 1)

    def forward(self, dense: dict[str, torch.Tensor], sparse: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        return {"click": self.top(torch.relu(self.bottom(dense["x"]))).squeeze(1)}

    def loss(self, outputs: dict[str, torch.Tensor], labels: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs["click"].float(), labels["click"])


def test_a_bf16_step_matches_fp32_to_bf16_rounding_and_keeps_fp32_weights_and_state() -> None:
    gen = torch.Generator().manual_seed(1)
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=[], values=torch.empty(0, dtype=torch.long), lengths=torch.empty(0, dtype=torch.long), stride=32
    )
    batch = Batch(
        dense={"x": torch.randn(32, 8, generator=gen)},
        sparse=sparse,
        labels={"click": torch.randint(0, 2, (32,), generator=gen).float()},
    )
    models, losses = [], []
    for precision in ("fp32", "bf16"):
        torch.manual_seed(2)
        model = _Tiny()
        optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
        losses.append([float(train_step(model, optimizer, batch, precision)) for _ in range(3)])
        models.append((model, optimizer))
    (fp32, _), (bf16, optimizer) = models
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    assert all(v.dtype == torch.float32 for state in optimizer.state.values() for v in state.values() if v.dim())
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=0)  # bf16 keeps 8 bits of mantissa
    assert losses[1] != losses[0]  # it did compute in bf16
    for got, want in zip(bf16.parameters(), fp32.parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=0.05)


BF16_SPEC = """\
version: 1
name: bf
features:
  dense:
    - {name: num, size: 4}
  sparse:
    - {name: a, num_embeddings: 60, dim: 8}
model:
  top: {type: mlp, input: [dense.num, sparse.a], layers: [8, 1]}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 64
  precision: bf16
"""


def _no_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(features, "vector_features", lambda: AVX2_ONLY)


def test_train_refuses_bf16_on_the_worker_naming_the_spec_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bf.yaml"
    spec.write_text(BF16_SPEC)
    _no_bf16(monkeypatch)
    assert cli.main(["train", str(spec), "--steps", "1", "-o", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: rank 0: {spec}:14:3: training precision bf16 needs a CPU with bf16 arithmetic "
        f"(avx512bf16, amx-bf16, bf16); this one ({features.model()}) has none: train in fp32"
    )


def test_check_warns_about_bf16_on_a_cpu_without_it_and_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bf.yaml"
    spec.write_text(BF16_SPEC)
    _no_bf16(monkeypatch)
    assert cli.main(["check", str(spec)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{spec}: ok\n"
    assert err == (
        f"{spec}:14:3: warning: training precision bf16: this machine's CPU ({features.model()}) has no bf16 "
        "arithmetic (avx512bf16, amx-bf16, bf16); training would refuse it here\n"
    )


def test_train_with_bf16_where_the_cpu_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bf.yaml"
    spec.write_text(BF16_SPEC)
    monkeypatch.setattr(features, "vector_features", lambda: WITH_BF16)
    assert cli.main(["train", str(spec), "--steps", "2", "-o", str(tmp_path / "out")]) == 0
    assert '"steps": 2' in capsys.readouterr().out
