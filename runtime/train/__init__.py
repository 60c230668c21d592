"""Training: the loop, the pipeline, evaluation, checkpointing options and the torchrun worker."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "loop": ("TrainSummary", "make_dense_optimizer", "train", "train_step"),
        "train_pipeline": ("PipelineError", "TrainPipeline"),
        "checkpointing": ("Checkpointing",),
        "worker": ("load_module",),
    },
)
