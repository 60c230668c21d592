"""What a run reports: metrics over all ranks, the training monitor, the --log-dir files."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "metrics": ("MetricSet", "auc", "normalized_entropy"),
        "monitor": ("StepLog", "TrainingMonitor"),
        "run_log": ("RunLog",),
    },
)
