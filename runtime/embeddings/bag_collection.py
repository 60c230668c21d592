"""EmbeddingBagCollection: pooled embedding lookups with the optimizer in backward.

This is the `lookup` stage of the data flow (ids in a KeyedJaggedTensor in,
pooled embeddings in a KeyedTensor out). The sharding layer builds one
collection per rank over its local shards, which are just
`EmbeddingBagConfig`s of sub-tables.

Two compute kernels give the same numbers:

- `fused`: tables are grouped by (optimizer, pooling) into one fbgemm
  `SplitTableBatchedEmbeddingBagsCodegen` (TBE) per group; fbgemm applies the
  optimizer inside its backward (row-wise Adagrad on the CPU: fbgemm's or the
  C kernel of runtime/embeddings/native_update.py, whichever measured faster).
  fbgemm requires `embedding_dim % 4 == 0`.
  fbgemm has no CPU kernel for Adam, so on CPU Adam tables use the dense
  implementation below (same formulas, same state).
- `dense`: one `torch.nn.EmbeddingBag` per table, gradients through autograd
  (sparse), and the optimizer of `runtime.embeddings.optim` applied by a
  post-accumulate-grad hook on each weight. The reference, and the fallback
  when fbgemm_gpu cannot be imported.

Either way the training loop never sees the embedding weights: the collection
owns no `nn.Parameter` (its lookup modules are kept out of the module tree),
so `model.parameters()` of a parent yields the dense parameters only and can
go straight to a dense optimizer or DDP. `optimizer_in_backward` marks such
modules; `embedding_parameters()` returns the weights for inspection.

Output order: table order, then each table's `feature_names` order. A
feature that several tables read is looked up in each, its outputs named
`feature@table` (TorchRec's names). The input KeyedJaggedTensor may hold
other keys, or ours in another order; it is permuted once, with the
permutation cached per key tuple.

Pooling: `sum`, or `mean` = sum(w_i * e_i) / L with L the number of ids in
the bag (not the sum of the weights; an empty bag gives zeros). This is
fbgemm's forward; fbgemm's CPU backward drops the 1/L for weighted mean, so
mean tables run as sum pooling with per-id weights w_i / L, which gives the
exact gradient.

State dict: `<table>.weight` (rows x dim) and `<table>.<state>` for the
optimizer state (see `runtime.embeddings.optim`), identical for both kernels.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingOptimizer
from runtime.cpu import choice, huge_pages
from runtime.embeddings import native_update
from runtime.embeddings.concurrent import run_concurrently
from runtime.embeddings.ids import IdCheck
from runtime.embeddings.kernels import FUSED_DIM_MULTIPLE, check_compute_kernel
from runtime.embeddings.l2_penalty import penalized_lookup
from runtime.embeddings.optim import apply_update, init_state, state_shapes
from runtime.embeddings.table_state import TablesOutsideModuleTree
from runtime.sparse.jagged import KeyedJaggedTensor, KeyedTensor, KeySelection

__all__ = ["EmbeddingBagCollection"]

logger = logging.getLogger(__name__)


def _fbgemm() -> Any | None:
    """The fbgemm TBE module, or None when fbgemm_gpu is not importable."""
    try:
        from fbgemm_gpu import split_table_batched_embeddings_ops_training as tbe_ops
    except ImportError:
        return None
    return tbe_ops


class _Group(nn.Module):
    """A group of tables with one optimizer: `lookup` pools the bags; `forward` adds, in a training
    step with `embedding_l2`, that penalty's bags to the same call and keeps its value in `penalty`."""

    optimizer: EmbeddingOptimizer
    feature_tables: list[int]

    def __init__(self) -> None:
        super().__init__()
        # The last training step's embedding_l2 penalty (runtime/embeddings/l2_penalty.py).
        self.penalty: torch.Tensor | None = None

    def lookup(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        value_offsets: list[int] | None,
    ) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        value_offsets: list[int] | None,
    ) -> torch.Tensor:
        if self.optimizer.embedding_l2 == 0 or not torch.is_grad_enabled():
            return self.lookup(values, offsets, weights, value_offsets)
        pooled, self.penalty = penalized_lookup(
            self.lookup, values, offsets, weights, self.feature_tables, self.optimizer.embedding_l2
        )
        return pooled


class _FusedGroup(_Group):
    """Tables sharing one optimizer and pooling, looked up by one fbgemm TBE."""

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        optimizer: EmbeddingOptimizer,
        device: torch.device,
        tbe_ops: Any,
    ) -> None:
        super().__init__()
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            BoundsCheckMode,
            EmbeddingLocation,
            PoolingMode,
        )

        optim_types = {
            "sgd": EmbOptimType.EXACT_SGD,
            "adagrad": EmbOptimType.EXACT_ADAGRAD,
            "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "adam": EmbOptimType.ADAM,
        }
        on_cpu = device.type == "cpu"
        location = EmbeddingLocation.HOST if on_cpu else EmbeddingLocation.DEVICE
        compute = tbe_ops.ComputeDevice.CPU if on_cpu else tbe_ops.ComputeDevice.CUDA
        self.tables = tables
        self.optimizer = optimizer
        self.mean = tables[0].pooling == "mean"
        self.tbe = tbe_ops.SplitTableBatchedEmbeddingBagsCodegen(
            [(t.num_embeddings, t.embedding_dim, location, compute) for t in tables],
            feature_table_map=[i for i, t in enumerate(tables) for _ in t.feature_names],
            optimizer=optim_types[optimizer.type],
            learning_rate=optimizer.lr,
            eps=optimizer.eps,
            beta1=optimizer.beta1,
            beta2=optimizer.beta2,
            weight_decay=optimizer.weight_decay,
            # Mean runs as weighted sum pooling (see the module docstring).
            pooling_mode=PoolingMode.SUM,
            device=device,
            # The collection checks ids itself, with the feature's name in the error.
            bounds_check_mode=BoundsCheckMode.NONE,
            table_names=[t.name for t in tables],
        )
        if on_cpu:
            for state in (self.tbe.weights_host, getattr(self.tbe, "momentum1_host", None)):
                if state is not None:
                    huge_pages.use_huge_pages(state)  # rows read at random: see runtime/cpu/huge_pages.py
        supported = on_cpu and native_update.supports(self.tbe, optimizer.type, optimizer.weight_decay)
        self._native_layout = native_update.layout(self.tbe) if supported else None
        self.feature_tables = [i for i, t in enumerate(tables) for _ in t.feature_names]

    def lookup(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        value_offsets: list[int] | None,
    ) -> torch.Tensor:
        """The pooled output of every bag of `offsets`."""
        if self.mean:
            lengths = offsets[1:] - offsets[:-1]
            scale = lengths.clamp(min=1).to(torch.float32).reciprocal()
            scale = scale.repeat_interleave(lengths, output_size=values.numel())
            weights = scale if weights is None else weights * scale
        return native_update.lookup(self.tbe, self._native_layout, values, offsets, weights)

    def table_tensors(self) -> list[dict[str, torch.Tensor]]:
        """Per table: live views of its weight and optimizer state."""
        names = [n for n in state_shapes(self.optimizer, 1, 1) if n != "iter"]
        states = self.tbe.split_optimizer_states() if names else [[] for _ in self.tables]
        tables = []
        for weight, state in zip(self.tbe.split_embedding_weights(), states):
            tensors = {"weight": weight, **dict(zip(names, state))}
            if self.optimizer.type == "adam":
                tensors["iter"] = self.tbe.iter
            tables.append(tensors)
        return tables

    def set_lr_scale(self, scale: float) -> None:
        """Train on at `scale` times the optimizer's learning rate (a schedule's factor)."""
        self.tbe.set_learning_rate(self.optimizer.lr * scale)

    def after_load(self) -> None:
        if self.optimizer.type == "adam":
            # fbgemm re-reads its host copy of the step counter from `iter` when it is 0.
            self.tbe.iter_cpu.zero_()


class _DenseTable(nn.EmbeddingBag):
    """One table on torch.nn.EmbeddingBag whose optimizer runs when its gradient lands."""

    def __init__(self, config: EmbeddingBagConfig, optimizer: EmbeddingOptimizer, device: torch.device) -> None:
        rows, dim = config.num_embeddings, config.embedding_dim
        super().__init__(
            rows,
            dim,
            mode=config.pooling,
            sparse=True,
            _weight=torch.empty(rows, dim, device=device),
        )
        self.optimizer = optimizer
        self.lr = optimizer.lr  # this step's: a schedule changes it (set_lr_scale)
        self.state_names = tuple(state_shapes(optimizer, rows, dim))
        for name, tensor in init_state(optimizer, rows, dim, device).items():
            self.register_buffer(name, tensor)
        self._register_optimizer_hook()

    def _register_optimizer_hook(self) -> None:
        self.weight.register_post_accumulate_grad_hook(self._step)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # copy.deepcopy and pickle drop tensor hooks; put ours back.
        super().__setstate__(state)
        self._register_optimizer_hook()

    def _step(self, weight: torch.Tensor) -> None:
        grad, weight.grad = weight.grad, None
        grad = grad.coalesce()
        apply_update(self.optimizer, weight, self.tensors(), grad.indices()[0], grad.values(), self.lr)

    def lookup(self, values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """Pools one feature; `offsets` holds the B + 1 bag boundaries into `values`."""
        if self.mode == "mean" and weights is not None:
            pooled = F.embedding_bag(
                values,
                self.weight,
                offsets[:-1],
                mode="sum",
                sparse=True,
                per_sample_weights=weights,
            )
            return pooled / (offsets[1:] - offsets[:-1]).clamp(min=1).unsqueeze(1)
        return self(values, offsets[:-1], per_sample_weights=weights)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weight and optimizer state (live tensors)."""
        return {"weight": self.weight, **{n: getattr(self, n) for n in self.state_names}}


class _DenseGroup(_Group):
    """Tables looked up one torch.nn.EmbeddingBag at a time (the reference kernel)."""

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        optimizer: EmbeddingOptimizer,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.tables = tables
        self.optimizer = optimizer
        self.bags = nn.ModuleList(_DenseTable(t, optimizer, device) for t in tables)
        self.feature_tables = [i for i, t in enumerate(tables) for _ in t.feature_names]

    def lookup(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        value_offsets: list[int] | None,
    ) -> torch.Tensor:
        """The pooled output of every bag of `offsets`."""
        assert value_offsets is not None
        batch = (offsets.numel() - 1) // len(self.feature_tables)
        pooled = []
        for f, table in enumerate(self.feature_tables):
            start, end = value_offsets[f], value_offsets[f + 1]
            pooled.append(
                self.bags[table].lookup(
                    values[start:end],
                    offsets[f * batch : (f + 1) * batch + 1] - start,
                    None if weights is None else weights[start:end],
                )
            )
        return torch.cat(pooled, dim=1)

    def table_tensors(self) -> list[dict[str, torch.Tensor]]:
        """Per table: its live weight and optimizer state."""
        return [bag.tensors() for bag in self.bags]

    def set_lr_scale(self, scale: float) -> None:
        """Train on at `scale` times the optimizer's learning rate (a schedule's factor)."""
        for bag in self.bags:
            bag.lr = bag.optimizer.lr * scale

    def after_load(self) -> None:
        pass


class EmbeddingBagCollection(TablesOutsideModuleTree):
    """Pooled embedding lookups over many tables (see the module docstring).

    `forward(features)` returns a KeyedTensor with one B x dim block per
    feature, in `feature_names()` order. With `is_weighted` the KJT's weights
    multiply the ids (TorchRec's convention); otherwise weights are ignored.
    `bounds_check` (default on) checks the batch's layout and every id against
    its table's rows before any kernel runs (runtime/embeddings/ids.py) and
    raises a ValueError naming the feature, sample and numbers; fbgemm's own
    check is off. With `bounds_check=False` the batch is trusted: a bad one
    then makes the fused kernel read out of bounds. `lookup_threads` (default: torch's
    intra-op threads at construction) cuts the fused tables on the CPU into
    that many groups, looked up side by side (runtime/embeddings/concurrent.py)
    where that is the faster at the batch's shapes (runtime/cpu/choice.py, kernel 'lookup').
    """

    optimizer_in_backward = True

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        compute_kernel: str = "fused",
        optimizer: EmbeddingOptimizer | None = None,
        bounds_check: bool = True,
        lookup_threads: int | None = None,
    ) -> None:
        super().__init__()
        check_compute_kernel(compute_kernel)
        if not tables:
            raise ValueError("EmbeddingBagCollection needs at least one table")
        _check_names(tables, shared_features=True)
        device = torch.device(device if device is not None else "cpu")
        default_optimizer = optimizer if optimizer is not None else EmbeddingOptimizer()
        self._tables = list(tables)
        self._is_weighted = is_weighted
        self.compute_kernel = compute_kernel
        self.bounds_check = bounds_check
        threads = torch.get_num_threads() if lookup_threads is None else lookup_threads
        self.lookup_threads = threads if device.type == "cpu" and compute_kernel == "fused" else 1

        # Kept in a plain list, out of the module tree: see the module docstring.
        self._groups, order = _build_groups(tables, default_optimizer, compute_kernel, device, self.lookup_threads)

        names = embedding_names(tables)
        self._feature_names = [name for table_names in names for name in table_names]
        self._feature_dims = [t.embedding_dim for t in tables for _ in t.feature_names]
        # Lookup order: the features group after group (tables in table order inside a group).
        self._lookup_names = [f for i in order for f in tables[i].feature_names]
        self._lookup_tables = [tables[i] for i in order for _ in tables[i].feature_names]
        self._group_sizes = [sum(len(t.feature_names) for t in g.tables) for g in self._groups]
        lookup_outputs = [name for i in order for name in names[i]]
        columns = _feature_columns(lookup_outputs, self._feature_names, self._feature_dims)
        self._output_columns = None if columns is None else torch.tensor(columns, device=device)
        self._needs_value_offsets = len(self._groups) > 1 or isinstance(self._groups[0], _DenseGroup)
        self._select = KeySelection(self._lookup_names)
        self._check = IdCheck(
            self._lookup_names,
            [t.describe() for t in self._lookup_tables],
            [t.num_embeddings for t in self._lookup_tables],
        )
        self._init_weights()

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._tables)

    def is_weighted(self) -> bool:
        return self._is_weighted

    def feature_names(self) -> list[str]:
        """The output keys, in output order (`feature@table` for a feature that several tables read)."""
        return list(self._feature_names)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        self._forget_penalties()
        if self.bounds_check:
            features = self._check(features)
        kjt = self._select(features)
        weights = kjt.weights_or_none() if self._is_weighted else None
        if self._is_weighted and weights is None:
            raise ValueError("EmbeddingBagCollection(is_weighted=True) needs a KeyedJaggedTensor with weights")
        values, offsets = kjt.values(), kjt.offsets()
        value_offsets = kjt.offset_per_key() if self._needs_value_offsets else None
        pooled: torch.Tensor | tuple[torch.Tensor, ...]
        if len(self._groups) == 1:
            pooled = self._groups[0](values, offsets, weights, value_offsets)
        else:
            blocks = self._lookup_groups(kjt, weights, value_offsets)
            if self._output_columns is None:  # the groups' blocks in output order: placed only if asked
                pooled = tuple(blocks)
            else:
                pooled = torch.cat(blocks, dim=1).index_select(1, self._output_columns)
        return KeyedTensor(self._feature_names, self._feature_dims, pooled)

    def _lookup_groups(
        self, kjt: KeyedJaggedTensor, weights: torch.Tensor | None, value_offsets: list[int]
    ) -> list[torch.Tensor]:
        """Each group's pooled block; the groups run side by side on `lookup_threads` threads."""
        values, offsets, batch = kjt.values(), kjt.offsets(), kjt.stride()
        lookups, group_weights, first = [], [], 0
        for group, size in zip(self._groups, self._group_sizes):
            last = first + size
            start, end = value_offsets[first], value_offsets[last]
            lookups.append(
                functools.partial(
                    _group_lookup,
                    group,
                    values[start:end],
                    offsets[first * batch : last * batch + 1] - start,
                    [o - start for o in value_offsets[first : last + 1]],
                )
            )
            group_weights.append(None if weights is None else weights[start:end])
            first = last
        threads = min(self.lookup_threads, torch.get_num_threads())
        if (
            threads > 1
            and len(lookups) > 1
            and self._choose_concurrency(lookups, group_weights, values, batch, threads) == "sequential"
        ):
            threads = 1
        return run_concurrently(lookups, threads, group_weights)

    def _choose_concurrency(
        self,
        lookups: list[Callable[..., torch.Tensor]],
        group_weights: list[torch.Tensor | None],
        values: torch.Tensor,
        batch: int,
        threads: int,
    ) -> str:
        """'concurrent' or 'sequential' groups at these shapes, timed on the forward alone: a timed
        backward would step the fused optimizer."""
        rows = sum(t.num_embeddings for t in self._tables)
        width = sum(t.embedding_dim * len(t.feature_names) for t in self._tables)
        shape = (
            f"b{choice.bucket(batch)}_ids{choice.bucket(values.numel())}_tables{len(self._tables)}"
            f"_rows{rows}_width{width}_groups{len(lookups)}_t{threads}"
        )

        def timed(count: int) -> Callable[[], object]:
            def run() -> object:
                with torch.no_grad():
                    return run_concurrently(lookups, count, group_weights)

            return run

        return choice.choose("lookup", shape, {"sequential": timed(1), "concurrent": timed(threads)})

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> EmbeddingBagCollection:
        if recurse and self._output_columns is not None:
            self._output_columns = fn(self._output_columns)
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        tables = ", ".join(f"{t.name}({t.num_embeddings}x{t.embedding_dim}, {t.pooling})" for t in self._tables)
        return f"compute_kernel={self.compute_kernel!r}, tables=[{tables}]"


def _group_lookup(
    group: _FusedGroup | _DenseGroup,
    values: torch.Tensor,
    offsets: torch.Tensor,
    value_offsets: list[int],
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """One group's pooled block; the per-id weights come last, from run_concurrently."""
    return group(values, offsets, weights, value_offsets)


def _build_groups(
    tables: list[EmbeddingBagConfig],
    default_optimizer: EmbeddingOptimizer,
    compute_kernel: str,
    device: torch.device,
    threads: int,
) -> tuple[list[_FusedGroup | _DenseGroup], list[int]]:
    """Lookup modules per (optimizer, pooling), in order of first use, and their table order.

    A fused group on the CPU is cut into up to `threads` runs of its tables, with
    about equal work each, that runtime.embeddings.concurrent runs side by side.
    """
    tbe_ops = _fbgemm() if compute_kernel == "fused" else None
    if compute_kernel == "fused":
        for t in tables:
            if t.embedding_dim % FUSED_DIM_MULTIPLE:
                raise ValueError(
                    f"{t.describe()}: embedding_dim {t.embedding_dim} is not a multiple of "
                    f"{FUSED_DIM_MULTIPLE}, "
                    "which the fused (fbgemm) kernel requires; use compute_kernel='dense'"
                )
        if tbe_ops is None:
            logger.warning("fbgemm_gpu is not importable: using the dense embedding kernel")
    grouped: dict[tuple[EmbeddingOptimizer, str], list[int]] = {}
    for i, t in enumerate(tables):
        grouped.setdefault((t.optimizer or default_optimizer, t.pooling), []).append(i)
    groups: list[_FusedGroup | _DenseGroup] = []
    for (optimizer, _), indices in grouped.items():
        members = [tables[i] for i in indices]
        if tbe_ops is not None and device.type == "cpu" and optimizer.type == "adam":
            names = [t.name for t in members]
            logger.info("fbgemm has no CPU Adam: tables %s use the dense kernel", names)
            groups.append(_DenseGroup(members, optimizer, device))
        elif tbe_ops is not None:
            runs = _balanced_runs(members, threads) if device.type == "cpu" else [members]
            groups.extend(_FusedGroup(run, optimizer, device, tbe_ops) for run in runs)
        else:
            groups.append(_DenseGroup(members, optimizer, device))
    return groups, [i for indices in grouped.values() for i in indices]


def _balanced_runs(tables: list[EmbeddingBagConfig], parts: int) -> list[list[EmbeddingBagConfig]]:
    """At most `parts` contiguous runs of `tables`, each with about 1/parts of the work.

    Work is the pooled width a table adds, dim x features, which is what the
    lookup's kernels scale with for equal ids per feature.
    """
    work = [t.embedding_dim * len(t.feature_names) for t in tables]
    total, done, cuts = sum(work), 0, []
    for index, amount in enumerate(work[:-1]):
        done += amount
        if done * parts >= total * (len(cuts) + 1):
            cuts.append(index + 1)
    bounds = [0, *cuts, len(tables)]
    return [tables[a:b] for a, b in zip(bounds, bounds[1:])]


def _check_names(tables: list[Any], shared_features: bool = False) -> None:
    """Distinct table names, and each table's features distinct; a feature in several tables only
    where the collection names its outputs `feature@table` (`shared_features`)."""
    seen_tables: set[str] = set()
    feature_table: dict[str, str] = {}
    for t in tables:
        if t.name in seen_tables:
            raise ValueError(f"duplicate table name {t.name!r}")
        seen_tables.add(t.name)
        repeated = next((f for i, f in enumerate(t.feature_names) if f in t.feature_names[:i]), None)
        if repeated is not None:
            raise ValueError(f"table {t.name!r} names feature {repeated!r} twice")
        for f in t.feature_names:
            if f in feature_table and not shared_features:
                raise ValueError(f"feature {f!r} is looked up by tables {feature_table[f]!r} and {t.name!r}")
            feature_table.setdefault(f, t.name)


def embedding_names(tables: list[Any]) -> list[list[str]]:
    """Each table's output names, as TorchRec's `get_embedding_names_by_table`: a feature's name,
    or `feature@table` in every table of a feature that several tables read."""
    readers: dict[str, int] = {}
    for t in tables:
        for f in t.feature_names:
            readers[f] = readers.get(f, 0) + 1
    return [[f if readers[f] == 1 else f"{f}@{t.name}" for f in t.feature_names] for t in tables]


def _feature_columns(lookup: list[str], output: list[str], dims: list[int]) -> list[int] | None:
    """Columns of the lookup-order output to gather for output order; None if the same."""
    if lookup == output:
        return None
    dim = dict(zip(output, dims))
    start, starts = 0, {}
    for name in lookup:
        starts[name] = start
        start += dim[name]
    return [starts[name] + d for name in output for d in range(dim[name])]
