"""The state of embedding tables kept outside the module tree, shared by both collections.

`EmbeddingBagCollection` and `EmbeddingCollection` hold their lookup modules
(fbgemm TBEs, or torch tables with their optimizer hooks) in a plain list, so
a parent's `parameters()` never yields embedding weights. This base gives
them the rest of nn.Module's contract over that list: the state dict (one
`<table>.weight` and `<table>.<state>` entry per table, whatever the kernel),
device moves, and the table-order initialisation both kernels draw alike.

A subclass sets `self._tables` (configs with `name` and `init_range()`) and
`self._groups` (modules with `tables`, `table_tensors()`, `set_lr_scale()` and
`after_load()`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from runtime.embeddings.state_views import load_views, shape_mismatch

__all__ = ["TablesOutsideModuleTree"]


class TablesOutsideModuleTree(nn.Module):
    """nn.Module's state dict and `_apply` for tables held in `self._groups`."""

    _tables: list[Any]
    _groups: list[Any]

    @torch.no_grad()
    def _init_weights(self) -> None:
        # Table by table in table order, so both kernels draw the same numbers.
        tensors = self._table_tensors()
        for table in self._tables:
            tensors[table.name]["weight"].uniform_(*table.init_range())

    def _table_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each table's live weight and optimizer state, in table order."""
        by_name = {t.name: tensors for group in self._groups for t, tensors in zip(group.tables, group.table_tensors())}
        return {t.name: by_name[t.name] for t in self._tables}

    def embedding_parameters(self) -> dict[str, torch.Tensor]:
        """Each table's weight (rows x dim, live), by table name; trained in backward only."""
        return {name: tensors["weight"] for name, tensors in self._table_tensors().items()}

    def set_lr_scale(self, scale: float) -> None:
        """Every table trains at `scale` times its optimizer's learning rate from the next backward on.

        A learning-rate schedule's factor (runtime.train.lr_scheduler); each
        table keeps its own optimizer's base rate, per-table optimizers included.
        """
        for group in self._groups:
            group.set_lr_scale(scale)

    def _forget_penalties(self) -> None:
        """At the start of a forward: a group this step skips (no ids) must not report the last step's penalty."""
        for group in self._groups:
            group.penalty = None

    def embedding_penalty(self) -> torch.Tensor | None:
        """The L2 penalty of the rows the last training step looked up here, before its update (detached);
        None when no table has an `l2` (runtime/embeddings/l2_penalty.py)."""
        penalties = [group.penalty for group in self._groups if group.penalty is not None]
        return torch.stack(penalties).sum() if penalties else None

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for table, tensors in self._table_tensors().items():
            for name, tensor in tensors.items():
                destination[f"{prefix}{table}.{name}"] = tensor if keep_vars else tensor.detach()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        views = {
            f"{prefix}{table}.{name}": tensor
            for table, tensors in self._table_tensors().items()
            for name, tensor in tensors.items()
        }
        load_views(views, state_dict, prefix, strict, missing_keys, unexpected_keys, error_msgs, shape_mismatch)
        for group in self._groups:
            group.after_load()

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> TablesOutsideModuleTree:
        # The lookup modules are outside the module tree; move them with it.
        if recurse:
            for group in self._groups:
                group._apply(fn)
        return super()._apply(fn, recurse)
