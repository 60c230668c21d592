"""Training data: the `Batch` every reader yields, the readers, and the per-rank slices."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "batch": ("Batch",),
        "errors": ("DataError", "RowError"),
        "bad_rows": ("BadRowLog",),
        "criteo": ("CriteoReader",),
        "movielens": ("MovieLensReader",),
        "movielens_vocab": ("Vocabulary",),
        "sources": ("choose_data", "open_reader"),
        "loader": ("epoch_batches", "training_batches"),
        "synthetic": ("make_batch",),
        "sequence_check": ("check_timestamps",),
    },
)
