"""Training data: the `Batch` every reader yields, the readers, and the per-rank slices.

One package per reader (`criteo/`, `movielens/`, `synthetic/`, `tables/` for CSV and
Parquet, `prepared/` for data prepared once); `checks/` for what the readers count and
report about their rows, `files/` for opening text and Arrow files; the plumbing they
share beside them (`batch`, `columns`, `loader`, `rank_slices`, `sources`, ...).
"""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "batch": ("Batch",),
        "errors": ("DataError", "RowError"),
        "checks.bad_rows": ("BadRowLog",),
        "criteo.reader": ("CriteoReader",),
        "movielens.reader": ("MovieLensReader",),
        "movielens.vocab": ("Vocabulary",),
        "sources": ("choose_data", "open_reader"),
        "loader": ("epoch_batches", "training_batches"),
        "synthetic.batches": ("make_batch",),
        "checks.timestamps": ("check_timestamps",),
    },
)
