"""EmbeddingCollection: unpooled (sequence) embedding lookups with the optimizer in backward.

The sequence counterpart of `runtime.embeddings.bag_collection`: ids in a
KeyedJaggedTensor in, and out, per feature, a `JaggedTensor` whose values
are the looked-up rows [sum(L), dim] and whose lengths are the feature's
(TorchRec's `EmbeddingCollection`). Unlike TorchRec's, tables of different
widths may sit in one collection, and one table may serve several features
(a target item and the history of items share the item table).

The kernels are the bag collection's own (its lookup groups, fused optimizer
and dense reference), run with one id per bag, which yields exactly the rows:

- Each table is one lookup slot of its group; the slot's bags are the ids of
  all the table's features, one per bag (offsets 0, 1, 2, ...). The slots of
  a group need equal bag counts, so shorter slots end in empty bags (zero
  rows, never read back). A group's output is [max ids, sum of its dims]; a
  table's rows are its columns' first `ids` rows.
- Why not fbgemm's `PoolingMode.NONE`: on this CPU build it refuses tables of
  different widths in one TBE, and its backward is about 4x slower than the
  pooled kernel's for the same rows (one 1M x 64 table, 27k ids, row-wise
  Adagrad: 63 ms against 17 ms). fbgemm's variable-batch (VBE) pooled
  forward would avoid the empty bags but spends 0.5 s building its metadata
  on the CPU.

Gradients and optimizer state are those of the bag collection's kernels:
`fused` (fbgemm TBE, optimizer in backward; Adam on the CPU on the dense
kernel, as fbgemm has no CPU Adam) and `dense` (torch tables, optimizer from a
post-accumulate-grad hook). The state dict is `<table>.weight` and
`<table>.<state>`, as for bags.
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable

import torch

from runtime.config.embeddings import EmbeddingConfig, EmbeddingOptimizer
from runtime.embeddings.bag_collection import _build_groups, _check_names, embedding_names
from runtime.embeddings.concurrent import run_concurrently
from runtime.embeddings.ids import IdCheck
from runtime.embeddings.kernels import check_compute_kernel
from runtime.embeddings.table_state import TablesOutsideModuleTree
from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeySelection

__all__ = ["EmbeddingCollection"]


class EmbeddingCollection(TablesOutsideModuleTree):
    """Sequence embedding lookups over many tables (see the module docstring).

    `forward(features)` returns `{feature: JaggedTensor}` in `feature_names()`
    order (table order, then each table's features; `feature@table` for a
    feature that several tables read, as TorchRec names it), values [sum(L), dim]
    with the feature's lengths, and with `need_indices` the feature's ids as
    its weights (TorchRec's place for them). The KeyedJaggedTensor may hold
    other keys, in any order; its weights are ignored. `bounds_check` and
    `lookup_threads` as for `EmbeddingBagCollection`.
    """

    optimizer_in_backward = True

    def __init__(
        self,
        tables: list[EmbeddingConfig],
        device: torch.device | str | None = None,
        need_indices: bool = False,
        compute_kernel: str = "fused",
        optimizer: EmbeddingOptimizer | None = None,
        bounds_check: bool = True,
        lookup_threads: int | None = None,
    ) -> None:
        super().__init__()
        check_compute_kernel(compute_kernel)
        if not tables:
            raise ValueError("EmbeddingCollection needs at least one table")
        _check_names(tables, shared_features=True)
        device = torch.device(device if device is not None else "cpu")
        self._tables = list(tables)
        self._need_indices = need_indices
        self.compute_kernel = compute_kernel
        self.bounds_check = bounds_check
        threads = torch.get_num_threads() if lookup_threads is None else lookup_threads
        self.lookup_threads = threads if device.type == "cpu" and compute_kernel == "fused" else 1
        self._groups, order = _build_groups(
            [t.lookup_slot() for t in tables],
            optimizer if optimizer is not None else EmbeddingOptimizer(),
            compute_kernel,
            device,
            self.lookup_threads,
        )
        names = embedding_names(tables)
        self._feature_names = [name for table_names in names for name in table_names]
        lookup_tables = [tables[i] for i in order]
        self._lookup_names = [f for t in lookup_tables for f in t.feature_names]
        self._lookup_outputs = [name for i in order for name in names[i]]
        self._select = KeySelection(self._lookup_names)
        self._check = IdCheck(
            self._lookup_names,
            [t.describe() for t in lookup_tables for _ in t.feature_names],
            [t.num_embeddings for t in lookup_tables for _ in t.feature_names],
        )
        # Per group: for each of its tables (slots), the table's dim and its feature count.
        by_name = {t.name: t for t in tables}
        self._group_slots = [
            [(by_name[s.name].embedding_dim, len(by_name[s.name].feature_names)) for s in g.tables]
            for g in self._groups
        ]
        self._init_weights()

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._tables)

    def feature_names(self) -> list[str]:
        """The output keys, in output order."""
        return list(self._feature_names)

    def need_indices(self) -> bool:
        """Whether each output JaggedTensor carries its feature's ids as weights."""
        return self._need_indices

    def embedding_names_by_table(self) -> list[list[str]]:
        """Each table's output keys (TorchRec's name for them)."""
        return embedding_names(self._tables)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        self._forget_penalties()
        if self.bounds_check:
            features = self._check(features)
        kjt = self._select(features)
        values, length_per_key = kjt.values(), kjt.length_per_key()
        # Ids per table (slot), group by group, in lookup order.
        slot_rows, key = [], 0
        for slots in self._group_slots:
            rows = []
            for _, features_in_table in slots:
                rows.append(sum(length_per_key[key : key + features_in_table]))
                key += features_in_table
            slot_rows.append(rows)
        outputs = run_concurrently(self._lookups(values, slot_rows), min(self.lookup_threads, torch.get_num_threads()))
        # Each table's rows are its columns' first rows; cut them per feature. One split by columns,
        # not a slice per table: each slice's backward would write a zero gradient the size of the
        # whole output, so a group of F tables would cost F outputs' worth of zeros per step.
        blocks, key = [], 0
        for output, rows, slots in zip(outputs, slot_rows, self._group_slots):
            columns = torch.split(output, [dim for dim, _ in slots], dim=1)
            for count, (_, features_in_table), table_columns in zip(rows, slots, columns):
                blocks.extend(torch.split(table_columns[:count], length_per_key[key : key + features_in_table]))
                key += features_in_table
        batch = kjt.stride()
        lengths = kjt.lengths()
        ids = torch.split(values, length_per_key) if self._need_indices else [None] * len(blocks)
        by_name = {
            name: JaggedTensor(block, weights=key_ids, lengths=lengths[k * batch : (k + 1) * batch])
            for k, (name, block, key_ids) in enumerate(zip(self._lookup_outputs, blocks, ids))
        }
        return {name: by_name[name] for name in self._feature_names}

    def _lookups(self, values: torch.Tensor, slot_rows: list[list[int]]) -> list[Callable[[], torch.Tensor]]:
        """One call per group: its ids, one per bag, each slot padded to the group's longest."""
        lookups: list[Callable[[], torch.Tensor]] = []
        start = 0
        for group, rows, slots in zip(self._groups, slot_rows, self._group_slots):
            end = start + sum(rows)
            if end == start:
                width = sum(dim for dim, _ in slots)
                lookups.append(functools.partial(values.new_zeros, (0, width), dtype=torch.float32))
            else:
                lookups.append(
                    functools.partial(
                        group,
                        values[start:end],
                        _slot_offsets(rows, values.device),
                        None,
                        list(itertools.accumulate(rows, initial=0)),
                    )
                )
            start = end
        return lookups

    def extra_repr(self) -> str:
        tables = ", ".join(f"{t.name}({t.num_embeddings}x{t.embedding_dim})" for t in self._tables)
        return f"compute_kernel={self.compute_kernel!r}, tables=[{tables}]"


def _slot_offsets(rows: list[int], device: torch.device) -> torch.Tensor:
    """Offsets of `len(rows)` slots of max(rows) bags each, slot t's first rows[t] holding one id."""
    if len(rows) == 1:
        return torch.arange(rows[0] + 1, device=device)
    bags = max(rows)
    counts = torch.tensor(rows, device=device)
    starts = torch.tensor(list(itertools.accumulate(rows, initial=0))[:-1], device=device)
    index = torch.arange(bags, device=device)
    offsets = (starts.unsqueeze(1) + torch.minimum(index.unsqueeze(0), counts.unsqueeze(1))).flatten()
    return torch.cat([offsets, torch.tensor([sum(rows)], device=device)])
