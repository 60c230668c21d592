"""Serving MLPs whose float32 CPU layers read weights packed once for oneDNN.

An exported model's weights never change, so the per-call work of a
training linear on oneDNN (runtime/modules/linear.py: reorder the plain
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
  differ from the trained model's by the tables' rounding) takes the packed
  layer unless MKL is clearly faster on this machine at the layer's shapes
  (kernel 'packed_linear'; runtime/cpu/choice.py's MARGINS says why). On this project's AVX2 EPYC the packed
  layers of dlrm-bench's MLPs at batch 512 run at 150-190 GFLOP/s against
  MKL's 147 (MKL takes a generic path on CPUs that are not Intel's): the
  int8 criteo forward at batch 512 goes from 5.09 to 4.65 ms.

Either way the choice is asked of runtime/cpu/choice.py at every call,
which answers a repeated question from memory in a few microseconds.

`pack_mlps(model, exact)` swaps every plain MLP (no norm, dropout or
shortcut) of a loaded serving model for a `PackedMLP` holding the same
layers (same state dict); runtime/serving/export_dir.py's `load_weights`
calls it. Other devices and dtypes, autograd, and tracing (torch.export
turns oneDNN off) take the model's own `linear`, unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.cpu import choice
from runtime.modules.blocks import MLP
from runtime.modules.linear import linear, onednn_applies, onednn_chosen

__all__ = ["PackedMLP", "pack_mlps"]


def _packed_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() == 2
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and not torch.compiler.is_compiling()
        and not torch.compiler.is_exporting()
    )


def _plain(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
    out = F.linear(x, weight, bias)  # what `linear` runs off oneDNN
    return torch.relu_(out) if relu else out


class PackedMLP(MLP):
    """An MLP block whose plain layers run on weights packed once for oneDNN (see the module docstring)."""

    _packs: dict[int, tuple[int, int, torch.Tensor]]
    _shapes: dict[tuple[int, int, int], str | None]
    exact: bool

    @classmethod
    def from_mlp(cls, mlp: MLP, exact: bool) -> PackedMLP:
        """A PackedMLP holding `mlp`'s layers and settings (the same parameters, not copies).

        `exact`: compute the bits `mlp` computes (the layers follow `linear`'s choice); otherwise each
        layer takes the faster of MKL and its packed weight.
        """
        packed = cls.__new__(cls)
        packed.__dict__.update(mlp.__dict__)
        packed._packs, packed._shapes, packed.exact = {}, {}, exact
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._decorated or x.shape[-1] != self.in_features or not _packed_applies(x, self.linears[0].weight):
            return super().forward(x)  # which also names a wrong input width
        for k, (layer, act) in enumerate(zip(self.linears, self._activations)):
            relu = act is torch.relu_
            x = self._layer(k, x, layer.weight, layer.bias, relu)
            if act is not None and not relu:
                x = act(x)
        return x

    def _layer(self, k: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
        """Layer k on a float32 CPU input outside autograd (forward checked that for layer 0's input,
        and each layer's output keeps it); its own weight's dtype is checked here."""
        if weight.dtype != torch.float32:
            return linear(x, weight, bias, relu=relu)
        if self.exact:
            packed = onednn_chosen(x, weight, bias, relu)
        else:
            shape = self._shape(k, x, weight, bias, relu)
            packed = shape is not None and choice.choose("packed_linear", shape, {
                "aten": lambda: _plain(x, weight, bias, relu),
                "packed": lambda: self._packed(k, x, weight, bias, relu),
            }) == "packed"
        return self._packed(k, x, weight, bias, relu) if packed else _plain(x, weight, bias, relu)

    def _shape(self, k: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> str | None:
        """The 'packed_linear' question of layer k at x's batch and this thread count (None: oneDNN does
        not apply, MKL runs it), built once: a forward asks it of runtime/cpu/choice.py per layer."""
        batch, threads = x.shape[0], torch.get_num_threads()
        key = (k, batch, threads)  # layer k's shape, bias and activation are fixed
        if key not in self._shapes:
            self._shapes[key] = (
                f"b{choice.bucket(batch)}_in{weight.shape[1]}_out{weight.shape[0]}{'_bias' if bias is not None else ''}"
                f"{'_relu' if relu else ''}_t{threads}"
                if onednn_applies(x, weight) else None
            )
        return self._shapes[key]

    def _packed(self, k: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
        # Packed again if the weight was replaced or written to (load_state_dict copies in place).
        key = (weight.data_ptr(), weight._version)
        known = self._packs.get(k)
        if known is None or known[:2] != key:
            known = (*key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), x.shape[0]))
            self._packs[k] = known
        return torch.ops.mkldnn._linear_pointwise(x, known[2], bias, "relu" if relu else "none", [], "")


def pack_mlps(model: nn.Module, exact: bool) -> int:
    """Swap each plain MLP block of `model` for a PackedMLP in place; returns how many were swapped.

    `exact`: the model must score what it scored before (see the module docstring).
    """
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is MLP and not child._decorated
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedMLP.from_mlp(child, exact))
    return len(swaps)
