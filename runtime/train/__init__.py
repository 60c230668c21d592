"""Training: the run context, the loop and its callbacks, the pipeline, evaluation, checkpointing options and
the torchrun worker."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "loop": ("TrainSummary", "train", "train_step"),
        "context": ("RunContext",),
        "callbacks": ("Callback", "CallbackList"),
        "dense_optimizer": ("make_dense_optimizer",),
        "lr_scheduler": ("LrScheduler",),
        "train_pipeline": ("PipelineError", "TrainPipeline"),
        "checkpointing": ("Checkpointing",),
        "worker": ("load_module",),
    },
)
