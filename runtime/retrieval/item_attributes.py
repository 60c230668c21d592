"""The item catalogue of a two-tower head whose item tower reads attributes: item id -> attribute ids.

A DSSM item tower reads the item id and the item's attributes (category,
brand, campaign, price bucket...). A training row carries them, but the
uniform negatives, the full-catalogue metrics and the export compute an
item's vector from its id alone, so they look its attributes up here:
`lookup(ids)` gives each id's attribute ids ([n, A], -1 where unknown), and
`runtime.retrieval.head.item_batch` turns them into the one-id bags the
item tower's features hold, through the same sharded lookups as training.

The catalogue learns from the training rows (the spec's `item_attributes`
with `from: training`): before each training step's negatives are looked up,
`record` takes the global batch's (item id, attribute ids), every rank's
rows in rank order, so every rank holds the same catalogue and N ranks hold
what one process holds. The last row seen gives an item's attributes
(`on_conflict: last`), or a row whose attributes differ from the ones
recorded for its item stops training (`on_conflict: error`). An item not
yet seen has no attributes: its attribute bags are empty (a zero vector
under sum or mean pooling). The table is a buffer: checkpoints carry it.

    >>> catalogue = ItemAttributes(num_items=5, features=("brand",), on_conflict="last")
    >>> catalogue.record(torch.tensor([3, 3]), torch.tensor([[7], [8]]))
    >>> catalogue.lookup(torch.tensor([3, 4]))
    tensor([[ 8],
            [-1]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["CONFLICTS", "ItemAttributes"]

CONFLICTS = ("last", "error")


class ItemAttributes(nn.Module):
    """Item id -> the ids of `features` (one per item each); see the module docstring."""

    table: torch.Tensor  # [num_items, A] int64, -1 where not known

    def __init__(self, num_items: int, features: Sequence[str], on_conflict: str = "last") -> None:
        super().__init__()
        if on_conflict not in CONFLICTS:
            raise ValueError(f"item attributes: on_conflict {on_conflict!r} is not one of {', '.join(CONFLICTS)}")
        self.features = tuple(features)
        self.on_conflict = on_conflict
        self.register_buffer("table", torch.full((num_items, len(self.features)), -1, dtype=torch.long))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """[n, A]: the attribute ids of item ids [n]; -1 for an attribute not known (`lookup`)."""
        return self.lookup(ids)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """[n, A]: the attribute ids of item ids [n]; -1 for an attribute not known."""
        return self.table[ids.reshape(-1).to(device=self.table.device, dtype=torch.long)]

    @torch.no_grad()
    def record(self, ids: torch.Tensor, attributes: torch.Tensor) -> None:
        """Take rows in order: item ids [n] with their attribute ids [n, A]; a later row overrides an
        earlier one of the same item (or, with on_conflict 'error', must agree with it)."""
        ids = ids.reshape(-1).to(device=self.table.device, dtype=torch.long)
        attributes = attributes.to(device=self.table.device, dtype=torch.long).reshape(ids.numel(), -1)
        if not ids.numel():
            return
        if self.on_conflict == "error":
            self._refuse_conflicts(ids, attributes)
        # The last row of each id: index_copy_ with repeated indices keeps no defined one.
        order = torch.arange(ids.numel(), device=ids.device)
        last = torch.full((self.table.shape[0],), -1, dtype=torch.long, device=ids.device)
        last.scatter_reduce_(0, ids, order, reduce="amax")
        rows = torch.nonzero(last >= 0).squeeze(1)
        self.table[rows] = attributes[last[rows]]

    def _refuse_conflicts(self, ids: torch.Tensor, attributes: torch.Tensor) -> None:
        """Raise naming the first row whose attributes differ from an earlier row's of its item."""
        known = self.table[ids]
        clash = ((known >= 0) & (known != attributes)).any(dim=1)
        order = torch.argsort(ids, stable=True)  # rows of one item side by side, in row order
        repeated = ids[order][1:] == ids[order][:-1]
        within = repeated & (attributes[order][1:] != attributes[order][:-1]).any(dim=1)
        if not bool(clash.any()) and not bool(within.any()):
            return
        earlier: dict[int, torch.Tensor] = {}
        for row in range(ids.numel()):
            item = int(ids[row])
            before = earlier.get(item, self.table[item])
            differs = (before >= 0) & (before != attributes[row])
            if bool(differs.any()):
                column = int(torch.nonzero(differs)[0, 0])
                raise ValueError(
                    f"item {item}: its '{self.features[column]}' is {int(attributes[row, column])} in a training "
                    f"row but {int(before[column])} in an earlier one (item_attributes on_conflict: error)"
                )
            earlier[item] = attributes[row]
