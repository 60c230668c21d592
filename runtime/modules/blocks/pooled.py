"""Dense building blocks: the `model:` block types of a spec, as nn.Modules.

The compiler's lowering builds one module per block of the spec from the runtime
call its IR value lowers to (compiler/lowering/calls.py) and wires them after the
embedding stages; the other block types live beside this file, one module each.

DLRM spends more time in the 27 x 27 pairwise interaction than anywhere else
in its dense part apart from the MLP GEMMs. `DotInteraction` has a C
kernel (runtime/cpu/native) for the CPU and a hand-written autograd function
over `bmm` for everything (plain autograd over `bmm` + advanced indexing
doubles the batched GEMMs in backward and scatters the triangle through a
slow `index_put`); on the CPU the faster of the two for the block's shapes
is chosen by measurement (runtime/cpu/choice.py). benchmarks/blocks_bench.py
measures the alternatives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from runtime.cpu import choice, native
from runtime.modules.layers.arguments import check_layers as _check_layers
from runtime.modules.layers.arguments import check_probability
from runtime.modules.layers.arguments import check_size as _check_size
from runtime.modules.layers.arguments import owner as _owner
from runtime.modules.layers.autocast import bf16_autocast
from runtime.modules.layers.dropout import KeyedDropout
from runtime.modules.layers.linear import Linear, linear
from runtime.modules.layers.parametric_activations import PARAMETRIC_ACTIVATIONS, parametric_activation
from runtime.modules.layers.sync_norm import SyncBatchNorm
from runtime.sparse.jagged import ColumnPieces, KeyedTensor

__all__ = [
    "ACTIVATIONS",
    "BLOCK_TYPES",
    "Concat",
    "CrossNet",
    "DotInteraction",
    "DotProduct",
    "FactorizationMachine",
    "MLP",
    "MixtureOfExperts",
    "NORMS",
    "Sum",
]

# In-place variants where autograd only needs the result (relu, sigmoid,
# tanh): they act on a fresh GEMM output, so nothing else sees the overwrite
# and one (B x width) buffer per layer is saved.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
    "relu": torch.relu_,
    "sigmoid": torch.sigmoid_,
    "tanh": torch.tanh_,
    "gelu": F.gelu,
    "silu": F.silu,
    "none": None,
}


def _activation(
    owner: str, name: str, value: str | None, also: Sequence[str] = ()
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The plain activation `value` names; `also`: the other names the caller takes, for the error."""
    key = "none" if value is None else value
    if key not in ACTIVATIONS:
        choices = ", ".join(sorted({*ACTIVATIONS, *also}))
        raise ValueError(f"{owner}: unknown {name} {value!r} (expected one of: {choices})")
    return ACTIVATIONS[key]


def _check_input(owner: str, x: torch.Tensor, width: int) -> None:
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{owner}: expected input of shape (B, {width}), got {tuple(x.shape)}")


NORMS = ("batch", "layer", "none")


class MLP(nn.Module):
    """Stack of Linear layers: h_{k+1} = act_k(W_k h_k + b_k).

    `activation` follows every hidden layer and `final_activation` the last
    one (None or "none" leaves a linear output, e.g. a logit).
    Shapes: (B, in_features) -> (B, layers[-1]). nn.Linear's default init.

    Options, on the layers followed by an activation (every hidden layer, and
    the last one unless its output is linear):
    h_{k+1} = shortcut(h_k) + dropout(act_k(norm(W_k h_k + b_k))).
    `norm`: "layer" (nn.LayerNorm) or "batch" (SyncBatchNorm over
    `process_group`, so N ranks normalise with the global batch's
    statistics; the layers it follows have no bias b_k, which it would cancel). `dropout`: a probability, masks drawn by KeyedDropout with
    `seed` and the layer index as its stream, so they do not depend on the
    world size. `residual`: the shortcut is h_k itself where the widths
    agree, else a bias-free linear projection of it (ResNet's option B).
    Left at their defaults, none of these modules exist and the layers run
    as before. `activation` or `final_activation` "prelu" or "dice" give each
    such layer a module of its own (runtime/modules/layers/parametric_activations.py;
    Dice's statistics span `process_group`).
    """

    def __init__(
        self,
        in_features: int,
        layers: Sequence[int],
        activation: str = "relu",
        final_activation: str | None = "relu",
        where: str = "",
        *,
        norm: str | None = None,
        dropout: float = 0.0,
        residual: bool = False,
        seed: int = 0,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.where = where
        owner = _owner("MLP", where)
        self.in_features = _check_size(owner, "in_features", in_features)
        self.layers = _check_layers(owner, "layers", layers)
        self.activation = activation
        self.final_activation = "none" if final_activation is None else final_activation
        hidden = (
            None
            if activation in PARAMETRIC_ACTIVATIONS
            else _activation(owner, "activation", activation, PARAMETRIC_ACTIVATIONS)
        )
        final = (
            None
            if final_activation in PARAMETRIC_ACTIVATIONS
            else _activation(owner, "final_activation", final_activation, PARAMETRIC_ACTIVATIONS)
        )
        self.out_features = self.layers[-1]
        widths = [self.in_features, *self.layers]
        self._activations = [hidden] * (len(self.layers) - 1) + [final]
        names = [activation] * (len(self.layers) - 1) + [self.final_activation]
        if parametric := [k for k, name in enumerate(names) if name in PARAMETRIC_ACTIVATIONS]:
            # PReLU and Dice hold parameters (Dice also batch statistics): one module per layer.
            self.parametric = nn.ModuleDict(
                {str(k): parametric_activation(names[k], self.layers[k], process_group, where) for k in parametric}
            )
            for k in parametric:
                self._activations[k] = self.parametric[str(k)]
        self.norm = _check_norm(owner, norm)
        # A bias before batch norm is cancelled by its mean: its true gradient is 0, and adaptive
        # optimizers would turn the rounding noise left in it into steps that differ across ranks.
        normed = len(self.layers) - (self.final_activation == "none") if self.norm == "batch" else 0
        self.linears = nn.ModuleList(
            Linear(a, b, bias=k >= normed) for k, (a, b) in enumerate(zip(widths[:-1], widths[1:]))
        )
        self.dropout = check_probability(owner, "dropout", dropout)
        if not isinstance(residual, bool):
            raise ValueError(f"{owner}: residual must be true or false (got {residual!r})")
        self.residual = residual
        self._decorated = self.norm != "none" or self.dropout > 0 or residual
        if self._decorated:
            self._decorate(owner, widths, seed, process_group)

    def _decorate(self, owner: str, widths: list[int], seed: int, process_group: dist.ProcessGroup | None) -> None:
        """Build the norms, dropouts and shortcuts of the layers followed by an activation."""
        count = len(self.layers) - (self.final_activation == "none")
        if count == 0:
            raise ValueError(
                f"{owner}: norm, dropout and residual apply to the layers followed by an activation, "
                f"and the only layer has final_activation none"
            )
        outs = widths[1 : count + 1]
        if self.norm == "layer":
            self.norms = nn.ModuleList(nn.LayerNorm(w) for w in outs)
        elif self.norm == "batch":
            self.norms = nn.ModuleList(SyncBatchNorm(w, process_group=process_group, where=self.where) for w in outs)
        if self.dropout > 0:
            self.dropouts = nn.ModuleList(
                KeyedDropout(self.dropout, seed, k, process_group, where=self.where) for k in range(count)
            )
        if self.residual:
            self.shortcuts = nn.ModuleList(
                nn.Identity() if a == b else Linear(a, b, bias=False) for a, b in zip(widths[:count], outs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(_owner("MLP", self.where), x, self.in_features)
        for k, (layer, act) in enumerate(zip(self.linears, self._activations)):
            if self._decorated and k < len(self.layers) - (self.final_activation == "none"):
                x = self._decorated_layer(k, x, layer, act)
                continue
            fused_relu = act is torch.relu_
            x = linear(x, layer.weight, layer.bias, relu=fused_relu)
            if act is not None and not fused_relu:
                x = act(x)
        return x

    def _decorated_layer(
        self, k: int, x: torch.Tensor, layer: nn.Module, act: Callable[[torch.Tensor], torch.Tensor] | None
    ) -> torch.Tensor:
        fused_relu = act is torch.relu_ and self.norm == "none"
        y = linear(x, layer.weight, layer.bias, relu=fused_relu)
        if self.norm != "none":
            y = self.norms[k](y)
        if act is not None and not fused_relu:
            y = act(y)
        if self.dropout > 0:
            y = self.dropouts[k](y)
        return y + self.shortcuts[k](x) if self.residual else y

    def extra_repr(self) -> str:
        extras = f", norm={self.norm}, dropout={self.dropout}, residual={self.residual}" if self._decorated else ""
        return (
            f"in_features={self.in_features}, layers={self.layers}, "
            f"activation={self.activation}, final_activation={self.final_activation}{extras}"
        )


def _check_norm(owner: str, norm: str | None, name: str = "norm") -> str:
    key = "none" if norm is None else norm
    if key not in NORMS:
        raise ValueError(f"{owner}: unknown {name} {norm!r} (expected one of: {', '.join(NORMS)})")
    return key


class _PairwiseDot(torch.autograd.Function):
    """cat([z_0, triu(Z Z^T, 1)]) for x viewed as Z (B, N, D), with one GEMM in backward.

    Forward: one bmm for the Gram matrix, then a flat `index_select` of the
    strict upper triangle on its (B, N*N) view. Backward: with G the output
    gradient of the triangle placed at (i, j), dZ = (G + G^T) Z; the symmetric
    S = G + G^T is gathered in one `index_select` from the gradient padded
    with a leading zero column (the diagonal), so a single bmm replaces the
    two that autograd would run, and no `index_put` is needed.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, num_vectors: int, triu_index: torch.Tensor, sym_index: torch.Tensor
    ) -> torch.Tensor:
        batch, dim = x.shape[0], x.shape[1] // num_vectors
        z = x.reshape(batch, num_vectors, dim)
        gram = torch.bmm(z, z.transpose(1, 2))
        pairs = gram.view(batch, num_vectors * num_vectors).index_select(1, triu_index)
        ctx.num_vectors = num_vectors
        # Saving x itself (not the view z made under no_grad) keeps the
        # backward differentiable, so double backward works.
        ctx.save_for_backward(x, sym_index)
        return torch.cat([x[:, :dim], pairs], dim=1)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        x, sym_index = ctx.saved_tensors
        batch, num_vectors = x.shape[0], ctx.num_vectors
        dim = x.shape[1] // num_vectors
        z = x.reshape(batch, num_vectors, dim)
        padded = F.pad(grad_out[:, dim:], (1, 0))
        sym = padded.index_select(1, sym_index).view(batch, num_vectors, num_vectors)
        grad_z = torch.bmm(sym, z)
        grad_z[:, 0].add_(grad_out[:, :dim])
        return grad_z.view(batch, num_vectors * dim), None, None, None


_Views = Callable[[torch.Tensor], list[torch.Tensor]]


def _width(x: torch.Tensor | KeyedTensor) -> int:
    return x.shape[1] if isinstance(x, torch.Tensor) else sum(x.length_per_key())


def _plain(x: torch.Tensor | KeyedTensor) -> torch.Tensor:
    """`x`'s values as one tensor outside autograd (a KeyedTensor's pieces copied, not placed)."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    pieces = x.pieces()
    return x.values().detach() if pieces is None else torch.cat(pieces.views(pieces.buffer.detach()), dim=1)


def _parts(bases: Sequence[torch.Tensor], views: Sequence[_Views | None]) -> list[torch.Tensor]:
    """The kernel's parts: each base itself, or its pieces where `views` gives them."""
    if not any(views):
        return list(bases)
    return [part for base, view in zip(bases, views) for part in (view(base) if view else [base])]


def _shapes(x: torch.Tensor | KeyedTensor, pieces: ColumnPieces | None) -> list[tuple[int, ...]]:
    """The shapes of the kernel's parts for one input, without making the pieces' views."""
    if pieces is None:
        return [tuple(x.shape)]
    batch = pieces.buffer.numel() // sum(pieces.widths)
    return [(batch, width) for width in pieces.widths]


class _NativeDot(torch.autograd.Function):
    """The same function on runtime/native's C kernel, reading the parts where they lie.

    An input is a tensor, one part; or a buffer whose pieces `views` gives (the ColumnPieces
    of a KeyedTensor), whose gradient the kernel writes in the buffer's own layout."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, dim: int, views: tuple[_Views | None, ...], *bases: torch.Tensor
    ) -> torch.Tensor:
        parts = _parts(bases, views)
        ctx.dim, ctx.views, ctx.shapes = dim, views, [base.shape for base in bases]
        ctx.save_for_backward(*parts)  # views share their base's version counter: in-place changes are caught
        return native.dot_forward(parts, dim)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # Every element is written: a tensor is one part, and pieces cover their buffer.
        grads = [torch.empty(shape) for shape in ctx.shapes]
        native.dot_backward(ctx.saved_tensors, ctx.dim, grad_out, _parts(grads, ctx.views))
        return (None, None, *(g if needed else None for g, needed in zip(grads, ctx.needs_input_grad[2:])))


class DotInteraction(nn.Module):
    """DLRM's pairwise dot interaction.

    The inputs, read together as one (B, N*D) row per sample, are N vectors
    z_0..z_{N-1} of width D (z_0 is the dense tower's output); each input
    holds whole vectors, so the lowering passes the dense output and the
    embeddings separately and nothing is concatenated on the C path. An
    input may be a KeyedTensor: where its values came as pieces of whole
    vectors (the pooled all-to-all's receive buffer), the C path reads them
    there and writes their gradient into the buffer's layout. Returns
    cat([z_0, <z_i, z_j> for i < j in row-major order]) = (B, D + N(N-1)/2);
    the pair order is torch.triu_indices(N, N, 1).

    float32 on the CPU runs runtime/cpu/native's C kernel where it is the
    faster for these shapes (runtime/cpu/choice.py, kernel 'dot'); other
    devices and dtypes, tracing, and the CPUs where torch wins run
    `_PairwiseDot` on torch ops. Under bf16 training (runtime.train.precision)
    the choice is between autocast's bf16 products and the C kernel in fp32
    on fp32 copies of the bf16 inputs (more exact, and at dlrm-bench's shapes
    on a Xeon with AMX 5.6 ms a step against 10.4 for bf16's bmm, triangle
    gather and concatenation); a separate question.
    """

    def __init__(self, num_vectors: int, dim: int, where: str = "") -> None:
        super().__init__()
        self.where = where
        owner = _owner("DotInteraction", where)
        self.num_vectors = _check_size(owner, "num_vectors", num_vectors, minimum=2)
        self.dim = _check_size(owner, "dim", dim)
        n = self.num_vectors
        self.num_pairs = n * (n - 1) // 2
        self.out_features = self.dim + self.num_pairs
        rows, cols = torch.triu_indices(n, n, offset=1)
        # sym[i, j] = sym[j, i] = 1 + pair number; 0 points at the zero pad (diagonal).
        sym = torch.zeros(n, n, dtype=torch.long)
        sym[rows, cols] = sym[cols, rows] = torch.arange(1, self.num_pairs + 1)
        self.register_buffer("triu_index", rows * n + cols, persistent=False)
        self.register_buffer("sym_index", sym.view(-1), persistent=False)
        # The kernel choice's (shape, site) names by (input widths, batch, threads, grad, bf16).
        self._questions: dict[tuple[tuple[int, ...], int, int, bool, bool], tuple[str, str]] = {}

    def forward(self, *inputs: torch.Tensor | KeyedTensor) -> torch.Tensor:
        bf16 = bf16_autocast()
        if bf16:  # the dense tower's output comes in bf16; the embeddings are fp32
            inputs = tuple(
                x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x for x in inputs
            )
        sources = [source for x in inputs for source in self._sources(x)]
        bases = [base for base, _ in sources]
        shapes = [shape for base, pieces in sources for shape in _shapes(base, pieces)]
        self._check_inputs(shapes)
        grad = torch.is_grad_enabled() and any(base.requires_grad for base in bases)
        batch = shapes[0][0]
        if batch > 0 and native.applies(bases) and self._choose(inputs, batch, grad, bf16) == "native":
            return self._native(bases, grad, [pieces.views if pieces else None for _, pieces in sources])
        return self._torch([x if isinstance(x, torch.Tensor) else x.values() for x in inputs])

    def _sources(self, x: torch.Tensor | KeyedTensor) -> list[tuple[torch.Tensor, ColumnPieces | None]]:
        """[(tensor, None)] for a tensor; for a KeyedTensor whose values lie in parts or pieces of
        whole vectors, [(part, None)] per part or [(buffer, its pieces)]; else [(its values, None)]."""
        if isinstance(x, torch.Tensor):
            return [(x, None)]
        parts = x.parts()
        if parts is not None and not any(part.shape[1] % self.dim for part in parts):
            return [(part, None) for part in parts]
        pieces = x.pieces()
        if pieces is None or any(width % self.dim for width in pieces.widths):
            return [(x.values(), None)]
        return [(pieces.buffer, pieces)]

    def _native(
        self, bases: Sequence[torch.Tensor], grad: bool, views: Sequence[_Views | None] | None = None
    ) -> torch.Tensor:
        views = tuple(views or [None] * len(bases))
        if grad:
            return _NativeDot.apply(self.dim, views, *bases)
        return native.dot_forward(_parts(bases, views), self.dim)

    def _torch(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        x = xs[0] if len(xs) == 1 else torch.cat(xs, dim=1)
        return _PairwiseDot.apply(x, self.num_vectors, self.triu_index, self.sym_index)

    def _choose(self, inputs: Sequence[torch.Tensor | KeyedTensor], batch: int, grad: bool, bf16: bool) -> str:
        """'native' or 'torch' for these shapes, timed on copies of the inputs (with backward if `grad`;
        under `bf16` autocast, which the torch path's products take)."""
        threads = torch.get_num_threads()
        question = (tuple(_width(x) for x in inputs), batch, threads, grad, bf16)
        if question not in self._questions:  # built once: a forward asks at every call
            widths = "-".join(str(width // self.dim) for width in question[0])
            site = (
                f"n{self.num_vectors}_d{self.dim}_parts{widths}_{'fwdbwd' if grad else 'fwd'}{'_bf16' if bf16 else ''}"
            )
            self._questions[question] = (f"b{choice.bucket(batch)}_{site}_t{threads}", site)
        shape, site = self._questions[question]
        return choice.choose("dot", shape, lambda: self._timed_runs(inputs, grad), site=site)

    def _timed_runs(self, inputs: Sequence[torch.Tensor | KeyedTensor], grad: bool) -> dict[str, Callable[[], object]]:
        """The two paths on copies of the inputs (with backward if `grad`), made only when the choice
        measures: a forward asks at every call."""

        @functools.cache  # copied once, when the first path runs
        def copies() -> list[torch.Tensor]:
            return [_plain(x).clone().requires_grad_(grad) for x in inputs]

        def timed(path: Callable[[Sequence[torch.Tensor], bool], torch.Tensor]) -> Callable[[], object]:
            def run() -> object:
                with torch.enable_grad() if grad else torch.no_grad():
                    out = path(copies(), grad)
                    return torch.autograd.grad(out, copies(), torch.ones_like(out)) if grad else out

            return run

        return {"torch": timed(lambda c, _: self._torch(c)), "native": timed(self._native)}

    def _check_inputs(self, shapes: Sequence[tuple[int, ...]]) -> None:
        """`shapes`: the kernel's parts' (an input's, or each of its pieces')."""
        width = self.num_vectors * self.dim
        owner = _owner("DotInteraction", self.where)
        if not shapes:
            raise ValueError(f"{owner}: expected input of shape (B, {width}), got no input")
        if len(shapes) == 1:
            if len(shapes[0]) != 2 or shapes[0][1] != width:
                raise ValueError(f"{owner}: expected input of shape (B, {width}), got {shapes[0]}")
            return
        if (
            any(len(s) != 2 or s[0] != shapes[0][0] or s[1] % self.dim for s in shapes)
            or sum(s[1] for s in shapes) != width
        ):
            raise ValueError(
                f"{owner}: expected inputs of shapes (B, k_i * {self.dim}) with sum k_i = "
                f"{self.num_vectors}, got {list(shapes)}"
            )

    def extra_repr(self) -> str:
        return f"num_vectors={self.num_vectors}, dim={self.dim}, out_features={self.out_features}"


class CrossNet(nn.Module):
    """DCN-v2 cross network: x_{l+1} = x_0 * (W_l x_l + b_l) + x_l, l < num_layers.

    With `low_rank` r, W_l = U_l V_l with U_l (in, r) and V_l (r, in).
    Shapes: (B, in_features) -> (B, in_features). Weights are xavier-normal
    and biases zero, as in TorchRec's CrossNet / LowRankCrossNet.
    """

    def __init__(self, in_features: int, num_layers: int, low_rank: int | None = None, where: str = "") -> None:
        super().__init__()
        self.where = where
        owner = _owner("CrossNet", where)
        self.in_features = _check_size(owner, "in_features", in_features)
        self.num_layers = _check_size(owner, "num_layers", num_layers)
        if low_rank is not None:
            _check_size(owner, "low_rank", low_rank)
        self.low_rank = low_rank
        self.out_features = in_features
        self.crosses = nn.ModuleList(self._cross_layer() for _ in range(num_layers))

    def _cross_layer(self) -> nn.Module:
        if self.low_rank is None:
            layer: nn.Module = Linear(self.in_features, self.in_features)
        else:
            layer = nn.Sequential(
                Linear(self.in_features, self.low_rank, bias=False),  # V_l
                Linear(self.low_rank, self.in_features),  # U_l, b_l
            )
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(_owner("CrossNet", self.where), x, self.in_features)
        x0 = x
        for cross in self.crosses:
            x = torch.addcmul(x, x0, cross(x))
        return x

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_layers={self.num_layers}, low_rank={self.low_rank}"


class FactorizationMachine(nn.Module):
    """Second-order FM term over N vectors of width D.

    y = 0.5 * sum_d[(sum_i v_{i,d})^2 - sum_i v_{i,d}^2] = sum_{i<j} <v_i, v_j>.
    Shapes: (B, N*D) -> (B, 1). With `vector`, the terms before the sum over d,
    y_d = 0.5 * [(sum_i v_{i,d})^2 - sum_i v_{i,d}^2]: (B, N*D) -> (B, D), as
    TorchEasyRec's FactorizationMachine returns them to DeepFM's final MLP.
    """

    def __init__(self, num_vectors: int, dim: int, where: str = "", vector: bool = False) -> None:
        super().__init__()
        self.where = where
        owner = _owner("FactorizationMachine", where)
        self.num_vectors = _check_size(owner, "num_vectors", num_vectors)
        self.dim = _check_size(owner, "dim", dim)
        self.vector = bool(vector)
        self.out_features = dim if self.vector else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(_owner("FactorizationMachine", self.where), x, self.num_vectors * self.dim)
        fields = x.reshape(x.shape[0], self.num_vectors, self.dim)
        if self.vector:
            return 0.5 * (fields.sum(dim=1).square() - fields.square().sum(dim=1))
        total = fields.sum(dim=1)
        return 0.5 * (total.square().sum(dim=1, keepdim=True) - x.square().sum(dim=1, keepdim=True))

    def extra_repr(self) -> str:
        return f"num_vectors={self.num_vectors}, dim={self.dim}" + (", vector=True" if self.vector else "")


def _check_same_shapes(owner: str, xs: Sequence[torch.Tensor]) -> None:
    if not xs:
        raise ValueError(f"{owner}: expected at least 1 input, got 0")
    shapes = [tuple(x.shape) for x in xs]
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError(f"{owner}: inputs must have the same shape, got {shapes}")


class DotProduct(nn.Module):
    """Row-wise dot product of two towers: y_b = <a_b, b_b>. (B, D), (B, D) -> (B, 1)."""

    def __init__(self, where: str = "") -> None:
        super().__init__()
        self.where = where

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        _check_same_shapes(_owner("DotProduct", self.where), (a, b))
        return (a * b).sum(dim=1, keepdim=True)


class Sum(nn.Module):
    """Elementwise sum x_1 + ... + x_k of equal-shaped tensors."""

    def __init__(self, where: str = "") -> None:
        super().__init__()
        self.where = where

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        _check_same_shapes(_owner("Sum", self.where), xs)
        if len(xs) == 1:
            return xs[0]
        total = xs[0] + xs[1]
        for x in xs[2:]:
            total.add_(x)  # `total` is a fresh tensor; add's backward keeps no values
        return total


class Concat(nn.Module):
    """cat([x_1, ..., x_k], dim=1): (B, w_1), ..., (B, w_k) -> (B, sum w_i)."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        if not xs:
            raise ValueError("Concat: expected at least 1 input, got 0")
        return torch.cat(xs, dim=1)


class MixtureOfExperts(nn.Module):
    """Multi-gate mixture of experts (MMoE).

    E experts are MLPs (activation after every layer); task t has a softmax
    gate g_t(x) = softmax(W_t x + c_t) over the experts and output
    y_t = sum_e g_t(x)_e * expert_e(x).
    Shapes: (B, in_features) -> tuple of num_tasks tensors (B, expert_layers[-1]).
    """

    def __init__(
        self,
        in_features: int,
        num_experts: int,
        expert_layers: Sequence[int],
        num_tasks: int,
        activation: str = "relu",
        where: str = "",
    ) -> None:
        super().__init__()
        self.where = where
        owner = _owner("MixtureOfExperts", where)
        self.in_features = _check_size(owner, "in_features", in_features)
        self.num_experts = _check_size(owner, "num_experts", num_experts)
        self.expert_layers = _check_layers(owner, "expert_layers", expert_layers)
        self.num_tasks = _check_size(owner, "num_tasks", num_tasks)
        _activation(owner, "activation", activation)
        self.activation = activation
        self.out_features = self.expert_layers[-1]
        self.experts = nn.ModuleList(
            MLP(in_features, self.expert_layers, activation, activation) for _ in range(num_experts)
        )
        self.gates = nn.ModuleList(Linear(in_features, num_experts) for _ in range(num_tasks))

    def gate_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax gate weights, (B, num_tasks, num_experts); each row sums to 1."""
        return torch.stack([torch.softmax(gate(x), dim=1) for gate in self.gates], dim=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _check_input(_owner("MixtureOfExperts", self.where), x, self.in_features)
        experts = torch.stack([expert(x) for expert in self.experts], dim=1)  # (B, E, H)
        mixed = torch.bmm(self.gate_weights(x), experts)  # (B, T, H)
        return mixed.unbind(dim=1)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, num_experts={self.num_experts}, "
            f"expert_layers={self.expert_layers}, num_tasks={self.num_tasks}, "
            f"activation={self.activation}"
        )


BLOCK_TYPES: dict[str, type[nn.Module]] = {
    "mlp": MLP,
    "dot": DotInteraction,
    "crossnet": CrossNet,
    "fm": FactorizationMachine,
    "dot_product": DotProduct,
    "sum": Sum,
    "concat": Concat,
    "moe": MixtureOfExperts,
}
