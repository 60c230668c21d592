"""Serving MLPs whose float32 CPU layers read weights packed once for oneDNN.

An exported model's weights never change, so the per-call work of a
training linear on oneDNN (runtime/modules/layers/linear.py: reorder the plain
weight into oneDNN's blocked layout, 20-30 us a layer here) can be done
once: `torch.ops.mkldnn._reorder_linear_weight` packs each layer's weight
at its first call, and `torch.ops.mkldnn._linear_pointwise` then computes
x W^T + b with the ReLU fused, reading the packed weight (the op inductor
emits for frozen CPU linears).

Which layers run packed depends on what the export promises:

- An exact export (every table fp32) predicts exactly what the trained
  model scores, so a layer runs packed exactly where the model's own
  `linear` would run it on oneDNN (its measured choice, runtime/cpu/choice.py
  kernel 'linear'); the packed call gives the bits of the plain oneDNN call
  (tests/runtime/serving/test_packed_mlp.py). Where `linear` chose MKL, the
  layer stays on MKL, through the call `linear` makes there.
- An approximate export (fp16, int8 or int4 tables: its scores already
  differ from the trained model's by the tables' rounding) runs the block
  on packed oneDNN layers or on MKL, whichever runs the whole block faster
  on this machine at its shapes (kernel 'packed_mlp'). The block, not each
  layer, is timed: a layer timed alone shows less than what it costs between
  its neighbours. On this project's AVX2 EPYC one day's calibration timed
  dlrm-bench's layers at batch 512 within 0.5-3% of each other, while the
  whole bottom MLP took 0.99 ms on MKL against 1.11 ms packed, and the top
  2.07 against 2.18 (the fp16 criteo forward: 4.16-4.32 against 4.51-4.56
  ms); another day the packed layers were the faster (the int8 criteo
  forward: 4.65 against 5.09 ms).

An export whose dense blocks were asked in int8 (`reccompile export --dense
int8`) offers one more way, the block on int8 layers
(`torch.ops.quantized.linear_dynamic`, fbgemm's VNNI kernels on x86): each
weight quantized once per output row (symmetric, scale max|w|/127), each
layer's input per call over the whole tensor (asymmetric, 8 bits, 7 where
the CPU has no VNNI and fbgemm's int16 sums could saturate), products summed
in int32, bias and ReLU in float32. It scores differently from the float
block (tests/runtime/serving/test_int8_mlp.py bounds by how much), so it is
taken only where asked, and there only where it runs the block faster than
the float way chosen above (kernel 'mlp_int8'); TorchRec's int8 inference
keeps its MLPs in float32, so the int8 tables alone compare like for like.

Either way the choice is asked of runtime/cpu/choice.py at every call,
which answers a repeated question from memory in a few microseconds.

`pack_mlps(model, exact, int8)` swaps every plain MLP (no norm, dropout or
shortcut) of a loaded serving model for a `PackedMLP` holding the same
layers (same state dict); runtime/serving/export_dir.py's `load_weights`
calls it. Other devices and dtypes, autograd, and tracing (torch.export
turns oneDNN off) take the model's own `linear`, unchanged.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from runtime.cpu import choice, features
from runtime.modules.blocks.pooled import MLP
from runtime.modules.layers.linear import linear, onednn_applies, onednn_chosen

__all__ = ["PackedMLP", "pack_mlps"]

QUESTIONS_KEPT = 64  # (batch, threads) pairs a block keeps its questions for (a server sees many batch sizes)


@functools.cache
def _mkldnn_built() -> bool:
    return torch.backends.mkldnn.is_available()


def _packed_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    # Cheapest tests first: a forward asks at every call, and at batch 1 the whole block's
    # products take 20-40 us (the property `mkldnn.enabled` alone costs about 0.5 us).
    return (
        x.is_cpu
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() == 2
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and not torch.compiler.is_compiling()
        and not torch.compiler.is_exporting()
        and _mkldnn_built()
        and torch.backends.mkldnn.enabled
    )


def _plain(
    x: torch.Tensor, weight: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None, relu: bool
) -> torch.Tensor:
    """x W^T + b, ReLU'd if `relu`, off oneDNN; `weight_t` is `weight.t()` (a view kept per layer)."""
    if relu and bias is not None and x.dim() == 2:
        # addmm and relu in one op, the same bits: 5-8 us less a small layer at batch 64 on the AVX-512 EPYC
        return torch._addmm_activation(bias, x, weight_t)
    out = F.linear(x, weight, bias)  # what `linear` runs off oneDNN
    return torch.relu_(out) if relu else out


# Which layers of a block run on their packed weight: (layer, input, weight, bias, relu) -> bool.
_Packs = Callable[[int, torch.Tensor, torch.Tensor, "torch.Tensor | None", bool], bool]
# A layer as a forward reads it: the module, its weight, weight.t() (a view), bias, ReLU fused, the
# activation after it.
_Layer = tuple[
    nn.Module, torch.Tensor, torch.Tensor, "torch.Tensor | None", bool, "Callable[[torch.Tensor], torch.Tensor] | None"
]


def _where(applies: tuple[bool, ...]) -> _Packs:
    """The `_Packs` that packs layer k where `applies[k]` (oneDNN applies to it at the batch asked)."""
    return lambda k, x, weight, bias, relu: applies[k]


def int8_available() -> bool:
    """Whether this torch has a quantized engine to run int8 layers on."""
    return torch.backends.quantized.engine != "none"


def quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` as qint8, one symmetric scale per output row (max |w| / 127, zero point 0)."""
    scales = (weight.detach().abs().amax(dim=1).double() / 127).clamp_min(1e-12)
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch 2.13 deprecates making quantized tensors; the ops still take them
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_channel(weight.detach(), scales, zeros, 0, torch.qint8)


@functools.cache
def reduce_range() -> bool:
    """Whether layer inputs are quantized to 7 bits: fbgemm sums pairs of u8 x s8 products in int16
    without VNNI, which 8-bit inputs could saturate (torch's own x86 qconfig does the same)."""
    return "avx512vnni" not in features.vector_features()


class PackedMLP(MLP):
    """An MLP block whose plain layers run on weights packed once for oneDNN (see the module docstring)."""

    _packs: dict[int, tuple[int, int, torch.Tensor]]
    # (batch, threads) -> the block's shape key ('mlp_int8' question), the 'packed_mlp' question, and
    # which layers oneDNN applies to
    _questions: dict[tuple[int, int], tuple[str, str | None, _Packs]]
    _int8: dict[int, tuple[int, int, str, object]]  # layer -> (weight pointer, version, engine, prepacked)
    _layers: tuple[_Layer, ...]  # what `_layer_table` last built
    exact: bool
    int8: bool

    @classmethod
    def from_mlp(cls, mlp: MLP, exact: bool, int8: bool = False) -> PackedMLP:
        """A PackedMLP holding `mlp`'s layers and settings (the same parameters, not copies).

        `exact`: compute the bits `mlp` computes (the layers follow `linear`'s choice); otherwise the
        block runs the faster way, MKL or packed, and with `int8` (not exact) also int8 where faster.
        """
        if exact and int8:
            raise ValueError("PackedMLP: an int8 block is not exact")
        packed = cls.__new__(cls)
        packed.__dict__.update(mlp.__dict__)
        packed._packs, packed._questions, packed.exact, packed.int8 = {}, {}, exact, int8
        packed._int8, packed._layers = {}, ()
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = self._layer_table()
        if self._decorated or x.shape[-1] != self.in_features or not _packed_applies(x, layers[0][1]):
            return super().forward(x)  # which also names a wrong input width
        if self.exact:
            return self._run(x, layers, lambda k, x, weight, bias, relu: onednn_chosen(x, weight, bias, relu))
        key, question, where = self._questions_at(x)
        if question is None and not self.int8:
            return self._run(x, layers, None)  # oneDNN applies to no layer: MKL's, nothing to ask
        packed = (
            question is not None
            and choice.choose(
                "packed_mlp",
                question,
                lambda: {"aten": lambda: self._run(x, layers, None), "packed": lambda: self._run(x, layers, where)},
            )
            == "packed"
        )
        packs = where if packed else None
        if self.int8 and int8_available():
            runs = {"float": lambda: self._run(x, layers, packs), "int8": lambda: self._run_int8(x)}
            if choice.choose("mlp_int8", key, runs) == "int8":
                return self._run_int8(x)
        return self._run(x, layers, packs)

    def _run(self, x: torch.Tensor, layers: tuple[_Layer, ...], packs: _Packs | None) -> torch.Tensor:
        """`layers` (`_layer_table()`) on a float32 CPU input outside autograd (forward checked that for
        layer 0's input, and each layer's output keeps it); `packs` says which run packed (None: none).
        A layer whose own weight is not float32 takes `linear`."""
        for k, (_, weight, weight_t, bias, relu, act) in enumerate(layers):
            if weight.dtype != torch.float32:
                x = linear(x, weight, bias, relu=relu)
            elif packs is not None and packs(k, x, weight, bias, relu):
                x = self._packed(k, x, weight, bias, relu)
            else:
                x = _plain(x, weight, weight_t, bias, relu)
            if act is not None and not relu:
                x = act(x)
        return x

    def _layer_table(self) -> tuple[_Layer, ...]:
        """Each layer's parameters, `weight.t()` and activation, read once: at batch 1 the module
        attribute lookups and transposes of a forward cost as much as the block's products. Built
        again when a layer's weight or bias is another tensor or storage (a copy into it shows in the
        views)."""
        linears, layers = self.linears._modules.values(), self._layers
        if len(layers) == len(linears):
            for layer, (module, weight, weight_t, bias, _, _) in zip(linears, layers, strict=True):
                held = layer._parameters
                if not (
                    layer is module
                    and held["weight"] is weight
                    and held["bias"] is bias
                    and weight.data_ptr() == weight_t.data_ptr()  # not given new storage (`.data = ...`)
                ):
                    break
            else:
                return layers
        with torch.inference_mode(False), torch.no_grad():  # plain views, whatever mode the first call is in
            self._layers = tuple(
                (layer, layer.weight, layer.weight.detach().t(), layer.bias, act is torch.relu_, act)
                for layer, act in zip(cast("list[nn.Linear]", self.linears), self._activations, strict=True)
            )
        return self._layers

    def _run_int8(self, x: torch.Tensor) -> torch.Tensor:
        """The layers on int8 weights and inputs (see the module docstring); a layer whose weight is not
        float32 takes `linear`."""
        engine, reduce = torch.backends.quantized.engine, reduce_range()
        layers = cast("list[nn.Linear]", self.linears)
        for k, (layer, act) in enumerate(zip(layers, self._activations, strict=True)):
            weight, relu = layer.weight, act is torch.relu_
            if weight.dtype != torch.float32:
                x = linear(x, weight, layer.bias, relu=relu)
            else:
                key = (weight.data_ptr(), weight._version, engine)
                known = self._int8.get(k)
                if known is None or known[:3] != key:
                    known = (*key, torch.ops.quantized.linear_prepack(quantize_weight(weight), layer.bias))
                    self._int8[k] = known
                op = torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic
                x = op(x.contiguous(), known[3], reduce)
            if act is not None and not relu:
                x = act(x)
        return x

    def _questions_at(self, x: torch.Tensor) -> tuple[str, str | None, _Packs]:
        """The block's key at x's batch and this thread count, `b<batch>_in<width>_<out>[r]..._t<threads>`
        (r: ReLU fused, batch: its bucket), the 'packed_mlp' question: the key, or None when oneDNN
        applies to no layer (MKL runs them all; 'mlp_int8' is asked at every batch, as int8 may still be
        faster), and which layers oneDNN applies to at this batch, as `_run` asks. Built once per
        (batch, threads), at most QUESTIONS_KEPT of them: a forward asks at every call, and at batch 64
        asking `onednn_applies` of each layer at each call cost more than the answer read here."""
        batch, threads = x.shape[0], torch.get_num_threads()
        known = self._questions.get((batch, threads))
        if known is None:
            widths = [
                (layer.out_features, act is torch.relu_)
                for layer, act in zip(self.linears, self._activations, strict=True)
            ]
            layers = "_".join(f"{out}{'r' if relu else ''}" for out, relu in widths)
            key = f"b{choice.bucket(batch)}_in{self.in_features}_{layers}_t{threads}"
            applies = tuple(
                onednn_applies(x.new_empty(1, 1).expand(batch, layer.in_features), layer.weight)
                for layer in self.linears
            )
            if len(self._questions) >= QUESTIONS_KEPT:
                self._questions.clear()
            known = self._questions[(batch, threads)] = (key, key if any(applies) else None, _where(applies))
        return known

    def _packed(
        self, k: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool
    ) -> torch.Tensor:
        # Packed again if the weight was replaced or written to (load_state_dict copies in place).
        key = (weight.data_ptr(), weight._version)
        known = self._packs.get(k)
        if known is None or known[:2] != key:
            known = (*key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), x.shape[0]))
            self._packs[k] = known
        return torch.ops.mkldnn._linear_pointwise(x, known[2], bias, "relu" if relu else "none", [], "")


def pack_mlps(model: nn.Module, exact: bool, int8: bool = False) -> int:
    """Swap each plain MLP block of `model` for a PackedMLP in place; returns how many were swapped.

    `exact`: the model must score what it scored before (see the module docstring); `int8`: the
    blocks may run on int8 layers where that is faster.
    """
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is MLP and not child._decorated
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedMLP.from_mlp(child, exact, int8))
    return len(swaps)
