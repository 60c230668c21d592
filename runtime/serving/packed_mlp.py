"""Serving MLPs whose float32 CPU layers read weights packed once for oneDNN.

An exported model's weights never change, so the per-call work of a
training linear on oneDNN (runtime/modules/linear.py: reorder the plain
weight into oneDNN's blocked layout, 20-30 us a layer here) can be done
once: `torch.ops.mkldnn._reorder_linear_weight` packs each layer's weight
at its first call, and `torch.ops.mkldnn._linear_pointwise` then computes
x W^T + b with the ReLU fused, reading the packed weight (the op inductor
emits for frozen CPU linears). On this project's AVX2 EPYC the layers of
dlrm-bench's MLPs at batch 512 save 20-60 us a layer that way (3-7%).

A layer runs packed exactly where the model's own `linear` would run it on
oneDNN (its measured choice, runtime/cpu/choice.py kernel 'linear'), and
the packed call gives the bits of the plain oneDNN call
(tests/runtime/serving/test_packed_mlp.py): an fp32 export still predicts
exactly what the trained model scores. Where `linear` chose MKL, the layer
stays on MKL, for the same reason, through the call `linear` makes there.
Either way the choice is looked up once per layer and batch bucket
(runtime/serving/choice_memo.py), not at every call.

`pack_mlps(model)` swaps every plain MLP (no norm, dropout or shortcut) of
a loaded serving model for a `PackedMLP` holding the same layers (same
state dict); runtime/serving/export_dir.py's `load_weights` calls it.
Other devices and dtypes, autograd, and tracing (torch.export turns oneDNN
off) take the model's own `linear`, unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.cpu import choice
from runtime.modules.blocks import MLP
from runtime.modules.linear import linear, onednn_applies, onednn_chosen
from runtime.serving.choice_memo import ChoiceMemo

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


class PackedMLP(MLP):
    """An MLP block whose plain layers run on weights packed once for oneDNN (see the module docstring)."""

    _packs: dict[int, tuple[int, int, torch.Tensor]]
    _decisions: ChoiceMemo

    @classmethod
    def from_mlp(cls, mlp: MLP) -> PackedMLP:
        """A PackedMLP holding `mlp`'s layers and settings (the same parameters, not copies)."""
        packed = cls.__new__(cls)
        packed.__dict__.update(mlp.__dict__)
        packed._packs, packed._decisions = {}, ChoiceMemo()
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
        if not _packed_applies(x, weight):
            return linear(x, weight, bias, relu=relu)
        if onednn_applies(x, weight) and self._onednn_chosen(k, x, weight, bias, relu):
            return self._packed(k, x, weight, bias, relu)
        out = F.linear(x, weight, bias)  # what `linear` runs off oneDNN
        return torch.relu_(out) if relu else out

    def _onednn_chosen(self, k: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> bool:
        # `linear`'s choice, kept per layer and batch bucket (runtime/serving/choice_memo.py).
        key = (k, choice.bucket(x.shape[0]), torch.get_num_threads())
        return self._decisions.get(key, lambda: onednn_chosen(x, weight, bias, relu))

    def _packed(self, k: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
        # Packed again if the weight was replaced or written to (load_state_dict copies in place).
        key = (weight.data_ptr(), weight._version)
        known = self._packs.get(k)
        if known is None or known[:2] != key:
            known = (*key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), x.shape[0]))
            self._packs[k] = known
        return torch.ops.mkldnn._linear_pointwise(x, known[2], bias, "relu" if relu else "none", [], "")


def pack_mlps(model: nn.Module) -> int:
    """Swap each plain MLP block of `model` for a PackedMLP in place; returns how many were swapped."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is MLP and not child._decorated
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedMLP.from_mlp(child))
    return len(swaps)
