"""Evaluation: a model's metrics over one pass of an evaluation split, over all ranks.

Every rank runs forward on its share of every batch (sharded embeddings
exchange ids, so all ranks must take part even when the last batch has
nothing real for one of them); padding samples are left out of the metrics.
A retrieval head's held-out positives are ranked against every item of its
table, whose vectors the model's `item_catalogue` gives (generated for a
spec with a sampled_softmax head); the log steps of training rank against
`training_catalogue(model)`: each step's candidates as its forward computed them
(runtime.retrieval.catalogue).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from runtime.config.heads import HeadConfig
from runtime.data.loader import LocalBatch
from runtime.reporting.metrics import MetricSet, MetricValues
from runtime.retrieval import catalogue


def item_catalogue(model: torch.nn.Module) -> catalogue.Catalogue | None:
    """Every item of the model's table (its `item_catalogue`, through a DDP wrapper), or None
    without a retrieval head."""
    vectors: Callable[[], torch.Tensor] | None = getattr(_inner(model), "item_catalogue", None)
    return None if vectors is None else catalogue.ExactCatalogue(vectors)


def training_catalogue(model: torch.nn.Module) -> catalogue.StepCandidates | None:
    """What the log steps of training rank a retrieval head against (each step's candidates as its
    forward computed them, runtime.retrieval.catalogue), or None without a retrieval head."""
    inner = _inner(model)
    if getattr(inner, "item_catalogue", None) is None:
        return None
    return catalogue.StepCandidates(inner.retrieval_loss)


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # through a DDP wrapper


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
