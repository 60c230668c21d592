"""One rank's lookups: table configs, the collection on fbgemm TBE, optimizer math, state views."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "bag_collection": ("EmbeddingBagCollection",),
        "sequence_collection": ("EmbeddingCollection",),
        # TorchRec's users import the table configs here (torchrec.EmbeddingBagConfig); they live in the contract room
        "runtime.config.embeddings": ("EmbeddingBagConfig", "EmbeddingConfig", "EmbeddingOptimizer"),
        "concurrent": ("run_concurrently",),
        "state_views": ("load_views",),
    },
)
