"""Checkpoints on torch.distributed.checkpoint: atomic, resumable, loadable at another world size."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "files": ("CheckpointError", "latest_checkpoint"),
        "states": ("CheckpointStates", "Stateful"),
        "store": ("Resumed", "load_checkpoint", "load_model_state", "read_checkpoint_manifest", "save_checkpoint"),
    },
)
