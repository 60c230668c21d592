"""One rank's lookups: table configs, the collection on fbgemm TBE, optimizer math, state views."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "bag_collection": ("EmbeddingBagCollection", "EmbeddingBagConfig"),
        "sequence_collection": ("EmbeddingCollection", "EmbeddingConfig"),
        "optim": ("EmbeddingOptimizer",),
        "concurrent": ("run_concurrently",),
        "state_views": ("load_views",),
    },
)
