"""The run context: what one training run is, built once by the worker and read by everything it calls.

The training functions (runtime.train.loop's `train`, runtime.train.run_setup's
`setup_run`, runtime.train.checkpointing's `Checkpointing`) take a `RunContext`
and only what truly varies between their calls (the model, the batches, the
step to start from), so a new option of the run is one more field read where it
is needed, not a keyword argument threaded through three signatures.

The context is frozen; `other_work` is the run's one mutable part, owned by the
run: the clock that hooks charge evaluation and checkpoint time to, so that
samples/s leaves it out (runtime.train.timing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime.config.data import ModelInputs
from runtime.train.options import TrainOptions
from runtime.train.timing import OtherWork

__all__ = ["RunContext"]


@dataclass(frozen=True)
class RunContext:
    """One run: its options, the compiled model's configs, and this rank's place in the process group.

    `options` carry the spec's defaults (`TrainOptions.with_spec_defaults`): `steps`,
    `batch_size` and `seed` are set. `spec_sha256` and `plan` are the generated
    module's (checkpoints record them).
    """

    options: TrainOptions
    inputs: ModelInputs
    spec_sha256: str = ""
    plan: Mapping[str, Any] = field(default_factory=dict)
    process_group: dist.ProcessGroup | None = None
    rank: int = 0
    world_size: int = 1
    device: torch.device | None = None
    other_work: OtherWork = field(default_factory=OtherWork)

    @property
    def steps(self) -> int:
        """The run's last step."""
        assert self.options.steps is not None, "RunContext needs options with the spec's defaults"
        return self.options.steps

    @property
    def global_batch(self) -> int:
        """The samples of one step over all ranks."""
        assert self.options.batch_size is not None, "RunContext needs options with the spec's defaults"
        return self.options.batch_size

    @property
    def seed(self) -> int:
        assert self.options.seed is not None, "RunContext needs options with the spec's defaults"
        return self.options.seed

    @property
    def log_every(self) -> int:
        return self.options.log_every

    @property
    def precision(self) -> str:
        """The dense layers' compute precision (runtime.train.precision)."""
        return self.inputs.training.precision

    @property
    def pipeline_depth(self) -> int:
        """Batches in flight: 1 trains plainly (runtime.train.train_pipeline)."""
        return self.options.pipeline_depth_for(self.world_size)

    @property
    def module_file(self) -> Path:
        """The generated module's file: its vocabulary and learned feature state are saved beside it."""
        return Path(self.options.module)
