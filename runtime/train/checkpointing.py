"""The worker's checkpoint options, and what it does with them: resume on start, save every K steps.

    --checkpoint-dir DIR    where checkpoints go (DIR/step_<N>; see runtime.checkpoint.files)
    --checkpoint-every K    save after every K steps, and after the last
    --keep K                keep only the newest K checkpoints (default: all)
    --resume                start from the latest complete checkpoint in DIR (an error if none)
    --allow-spec-change     resume from a checkpoint of another spec (entries must keep their shapes)

A worker that torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0, with
`--max-restarts`) resumes from the latest complete checkpoint by itself, or
starts afresh if none was written yet. `reccompile train` passes these
options through (`add_arguments`, `pass_through`), as it does runtime.train.run_setup's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, TextIO

import torch
import torch.distributed as dist

from runtime.checkpoint.store import (
    CheckpointError,
    Resumed,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from runtime.data.batch import Batch
from runtime.data.sources import choose_data
from runtime.reporting import console

# (flag, argparse keywords); `reccompile train` passes each through when given.
OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--checkpoint-dir", {"type": Path, "help": "write checkpoints to DIR/step_<N>"}),
    ("--checkpoint-every", {"type": int, "help": "save every K steps and after the last"}),
    ("--keep", {"type": int, "help": "keep only the newest K checkpoints (default: all)"}),
    ("--resume", {"action": "store_true", "help": "start from the latest checkpoint in DIR"}),
    ("--allow-spec-change", {"action": "store_true", "help": "resume from another spec's checkpoint"}),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint options (see the module docstring)."""
    for flag, keywords in OPTIONS:
        parser.add_argument(flag, **keywords)


def pass_through(args: argparse.Namespace) -> list[str]:
    """The worker arguments for the checkpoint options given in `args`."""
    argv: list[str] = []
    for flag, keywords in OPTIONS:
        value = getattr(args, _dest(flag))
        if keywords.get("action") == "store_true":
            argv += [flag] if value else []
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the checkpoint options of `args`, as the CLI reports it; None if nothing."""
    for flag in ("--checkpoint-every", "--keep"):
        value = getattr(args, _dest(flag))
        if value is not None and value < 1:
            return f"{flag} must be at least 1, got {value}"
    if args.checkpoint_dir is None:
        given = [flag for flag, _ in OPTIONS[1:] if getattr(args, _dest(flag)) not in (None, False)]
        if given:
            return f"{given[0]} needs --checkpoint-dir"
    return None


class Checkpointing:
    """One worker's checkpoints: `resume()` before training, `on_step` after each step.

    Inactive (every method a no-op) without --checkpoint-dir.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        module: ModuleType,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        process_group: dist.ProcessGroup | None,
        rank: int,
        stream: TextIO | None = None,
    ) -> None:
        problem = usage_error(args)
        if problem is not None:
            raise ValueError(problem)
        self.directory: Path | None = args.checkpoint_dir
        self.every: int | None = args.checkpoint_every
        self.keep: int | None = args.keep
        self.resume_requested: bool = args.resume
        self.allow_spec_change: bool = args.allow_spec_change
        self.module, self.model, self.optimizer = module, model, optimizer
        self.process_group, self.rank = process_group, rank
        self.stream = sys.stdout if stream is None else stream
        self.start_step = 0
        self.last_saved: int | None = None
        self._resumed: Resumed | None = None
        self._batches: Iterator[Batch] | None = None

    def resume(self, steps: int) -> int:
        """Load the latest checkpoint if asked to or restarted by torchrun; the step to go on from.

        `steps`: the run's last step, which the checkpoint must not be past.
        """
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        if self.directory is None or not (self.resume_requested or restarted):
            return 0
        if latest_checkpoint(self.directory) is None:
            if self.resume_requested:
                raise CheckpointError(f"--resume: no complete checkpoint in {self.directory}")
            return 0  # restarted before the first checkpoint: start afresh
        self._resumed = load_checkpoint(
            self.directory,
            self.model,
            self.optimizer,
            spec_sha256=self.module.SPEC_SHA256,
            allow_spec_change=self.allow_spec_change,
            process_group=self.process_group,
        )
        self.start_step = self.last_saved = self._resumed.step
        if self.start_step > steps:
            raise CheckpointError(
                f"{self._resumed.path} is at step {self.start_step}, past this run's last step {steps}"
            )
        why = "torchrun restarted this job" if restarted else "--resume"
        self._say(f"resumed from {self._resumed.path} at step {self.start_step} ({why})")
        return self.start_step

    def position(self, batches: Iterator[Batch], data: str | None) -> Iterator[Batch]:
        """`batches` of the worker's `--data` at the resumed data position.

        Synthetic batches are indexed by step: the worker starts them at
        `start_step`. Other iterators get their saved state (`load_state_dict`,
        same world size) or, failing that, the batches of the completed steps
        are drawn and dropped, which gives the same data order, slowly.
        """
        self._batches = batches
        if self.start_step == 0 or choose_data(data, self.module.SPEC).reader == "synthetic":
            return batches
        saved = self._resumed.data_state if self._resumed is not None else None
        if saved is not None and hasattr(batches, "load_state_dict"):
            batches.load_state_dict(saved)
            return batches
        self._say(f"skipping the {self.start_step} batches of the completed steps")
        for _ in range(self.start_step):
            next(batches)
        return batches

    def chain(self, hook: Callable[..., None] | None) -> Callable[..., None]:
        """A per-step hook for the training loop: `hook`'s work, then `on_step`."""
        if hook is None:
            return self.on_step

        def both(step: int, *rest: Any) -> None:
            hook(step, *rest)
            self.on_step(step)

        return both

    def on_step(self, step: int, *_: Any) -> None:
        """The training loop's per-step hook: save every --checkpoint-every steps."""
        if self.directory is not None and self.every is not None and step % self.every == 0:
            self.save(step)

    def finish(self, step: int) -> None:
        """After the last step: save it unless it was just saved."""
        if self.directory is not None and self.every is not None and self.last_saved != step:
            self.save(step)

    def save(self, step: int) -> None:
        assert self.directory is not None
        state_dict = getattr(self._batches, "state_dict", None)
        save_checkpoint(
            self.directory,
            self.model,
            self.optimizer,
            step=step,
            spec_sha256=self.module.SPEC_SHA256,
            plan=self.module.PLAN,
            data_state=state_dict() if callable(state_dict) else None,
            keep=self.keep,
            process_group=self.process_group,
        )
        self.last_saved = step

    def _say(self, line: str) -> None:
        if self.rank == 0:
            console.say(line, self.stream)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
