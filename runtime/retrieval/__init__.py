"""Retrieval: the two-tower sampled softmax, retrieval metrics, and the nearest-neighbour index.

Sits beside `modules` and `embeddings`: it needs only torch (and faiss, when
installed, for approximate indexes) and the torch-free `storage`, so the
training loop, reporting and serving above it can all use it.
"""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "sampled_softmax": ("SampledSoftmaxLoss", "sampled_softmax"),
        "frequency": ("StreamingFrequency", "counts_log_q"),
        "sampling": ("uniform_negatives",),
        "gather": ("gather_rows",),
        "metrics": ("RetrievalMetrics",),
        "index": ("ExactIndex", "FaissIndex", "build_index", "faiss_available"),
        "index_files": ("IndexFileError", "load_index", "save_index"),
        "index_quality": ("IndexQuality", "check_index"),
    },
)
