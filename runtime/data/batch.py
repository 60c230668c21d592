"""`Batch`: one step's input, as every reader yields it and every model takes it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.sparse.jagged import KeyedJaggedTensor


@dataclass
class Batch:
    """Dense features by name (each B x size), sparse ids, and labels by head label (each B)."""

    dense: dict[str, torch.Tensor]
    sparse: KeyedJaggedTensor
    labels: dict[str, torch.Tensor]

    @property
    def batch_size(self) -> int:
        return self.sparse.stride()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            dense={k: v.to(device, non_blocking=non_blocking) for k, v in self.dense.items()},
            sparse=self.sparse.to(device, non_blocking=non_blocking),
            labels={k: v.to(device, non_blocking=non_blocking) for k, v in self.labels.items()},
        )

    def pin_memory(self) -> Batch:
        return Batch(
            dense={k: v.pin_memory() for k, v in self.dense.items()},
            sparse=self.sparse.pin_memory(),
            labels={k: v.pin_memory() for k, v in self.labels.items()},
        )
