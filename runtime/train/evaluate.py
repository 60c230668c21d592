"""Evaluation: a model's metrics over one pass of an evaluation split, over all ranks.

Every rank runs forward on its share of every batch (sharded embeddings
exchange ids, so all ranks must take part even when the last batch has
nothing real for one of them); padding samples are left out of the metrics.
A retrieval head's held-out positives are ranked against every item of its
table, whose vectors the model's `item_catalogue` gives (generated for a
spec with a sampled_softmax head).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from runtime.data.loader import LocalBatch
from runtime.modules.losses import HeadConfig
from runtime.reporting.metrics import MetricSet, MetricValues


def item_catalogue(model: torch.nn.Module) -> Callable[[], torch.Tensor] | None:
    """The model's `item_catalogue` (through a DDP wrapper), or None without a retrieval head."""
    return getattr(getattr(model, "module", model), "item_catalogue", None)


def evaluate(
    model: torch.nn.Module,
    batches: Iterable[LocalBatch],
    heads: Sequence[HeadConfig],
    process_group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
) -> dict[str, MetricValues]:
    """head -> metric -> value over every real sample of `batches` on all ranks (a collective)."""
    metrics = MetricSet(heads, item_catalogue(model))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for local in batches:
            batch = local.batch if device is None else local.batch.to(device, non_blocking=True)
            metrics.update(model(batch.dense, batch.sparse), batch.labels, real=local.real)
    model.train(was_training)
    return metrics.compute(process_group)
