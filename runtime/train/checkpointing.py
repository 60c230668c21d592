"""What the worker does with its checkpoint options: resume on start, save every K steps and at the end.

    --checkpoint-dir DIR    where checkpoints go (DIR/step_<N>; see runtime.checkpoint.files);
                            without --checkpoint-every, one save after the last step
    --checkpoint-every K    also save after every K steps
    --keep K                keep only the newest K checkpoints (default: all)
    --resume                start from the newest intact checkpoint in DIR (an error if none)
    --allow-spec-change     resume from a checkpoint of another spec (entries must keep their shapes)
    --best-metric NAME      also keep the best evaluation's checkpoint in DIR/best (one, replaced
                            atomically by a better one; load it as any checkpoint directory)

A checkpoint keeps the run's kernel choices (runtime.train.kernel_choices)
and a resume runs them again, whatever the choice cache says by then.
A job that torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0 on any rank,
with `--max-restarts`) resumes from the latest complete checkpoint by itself,
or starts afresh if none was written yet. A damaged newest checkpoint is passed
over, with a warning naming it, for the newest intact one. A checkpoint
keeps the global batch size its steps consumed: resuming with another one
is refused, since the data position is counted in batches. Rank 0 holds
the directory's lock (runtime.checkpoint.lock) from `resume` to `close`.
The options themselves are runtime.train.options's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence, TextIO

import torch
import torch.distributed as dist

from runtime.checkpoint.files import complete_checkpoints
from runtime.checkpoint.lock import LOCK_FILE, DirectoryLock
from runtime.checkpoint.store import (
    CheckpointError,
    Resumed,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from runtime.data.batch import Batch
from runtime.data.movielens.vocab import VOCABULARY_FILE
from runtime.data.sources import choose_data
from runtime.features.state import FILE as FEATURES_FILE
from runtime.reporting import console
from runtime.train import kernel_choices
from runtime.config.lr_schedule import spell
from runtime.train.early_stopping import EarlyStopping
from runtime.train.feature_state import SUFFIX as FEATURES_SUFFIX
from runtime.train.lr_scheduler import LrScheduler
from runtime.train.options import TrainOptions
from runtime.train.timing import OtherWork

BEST_DIR = "best"  # under --checkpoint-dir: the best evaluation's checkpoint, DIR/best/step_<N>


def restarted_by_torchrun(process_group: dist.ProcessGroup | None) -> bool:
    """Whether torchrun restarted this job: the same answer on every rank (a collective).

    Each node's agent counts only its own restarts (TORCHELASTIC_RESTART_COUNT):
    when a rank on one node fails, that node's count goes up, but the other
    nodes restart for the new rendezvous round with theirs unchanged. All ranks
    must resume together, so they take the largest count of any rank.
    """
    count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if process_group is None:
        return count > 0
    cuda = dist.get_backend(process_group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    counts = torch.tensor([count], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=process_group)
    return int(counts.item()) > 0


def _some(entries: Sequence[str], shown: int = 3) -> str:
    """The first `shown` entries, and how many more: a spec change can skip hundreds."""
    more = len(entries) - shown
    return ", ".join(entries[:shown]) + (f" and {more} more" if more > 0 else "")


class Checkpointing:
    """One worker's checkpoints: `resume()` before training, `on_step` after each step.

    Inactive (every method a no-op) without --checkpoint-dir.
    """

    def __init__(
        self,
        options: TrainOptions,
        module: ModuleType,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        process_group: dist.ProcessGroup | None,
        rank: int,
        other_work: OtherWork | None = None,
        stream: TextIO | None = None,
        lr_scheduler: LrScheduler | None = None,
        early_stopping: EarlyStopping | None = None,
    ) -> None:
        self.directory: Path | None = options.checkpoint_dir
        self.every: int | None = options.checkpoint_every
        self.keep: int | None = options.keep
        self.resume_requested: bool = options.resume
        self.allow_spec_change: bool = options.allow_spec_change
        self.batch_size: int | None = options.batch_size
        self.seed: int | None = options.seed
        self.other_work = other_work if other_work is not None else OtherWork()
        self.module, self.model, self.optimizer = module, model, optimizer
        self.process_group, self.rank = process_group, rank
        self.lr_scheduler = lr_scheduler
        self.early_stopping = early_stopping
        self.stream = sys.stdout if stream is None else stream
        self.start_step = 0
        self.last_saved: int | None = None
        self.resumed_early_stopping = False  # the tracker goes on from the checkpoint's state
        self.best_path: Path | None = None  # DIR/best/step_<N>, once this run saved one
        self._resumed: Resumed | None = None
        self._batches: Iterator[Batch] | None = None
        self._lock: DirectoryLock | None = None

    def resume(self, steps: int) -> int:
        """Load the latest checkpoint if asked to or restarted by torchrun; the step to go on from.

        `steps`: the run's last step, which the checkpoint must not be past.
        """
        if self.directory is None:
            return 0
        if self.resume_requested and not self.directory.is_dir():  # before the lock would create it
            raise CheckpointError(f"--resume: no complete checkpoint in {self.directory}: it does not exist")
        if self.rank == 0:
            self._lock = DirectoryLock(self.directory)
        restarted = restarted_by_torchrun(self.process_group)
        if not (self.resume_requested or restarted):
            self._refuse_an_earlier_runs_checkpoints()
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
            fall_back=True,
            process_group=self.process_group,
        )
        for reason in self._resumed.passed_over:
            self._say(f"warning: passed over a damaged checkpoint: {reason}", sys.stderr)
        if self._resumed.skipped:
            self._say(f"warning: {self._resumed.path} lacks {_some(self._resumed.skipped)}: those keep their "
                      "fresh values (--allow-spec-change)", sys.stderr)  # fmt: skip
        saved_batch = self._resumed.manifest.get("global_batch_size")
        if saved_batch is not None and self.batch_size is not None and saved_batch != self.batch_size:
            raise CheckpointError(
                f"{self._resumed.path} was trained with batch size {saved_batch}, this run's is "
                f"{self.batch_size}: resume with --batch-size {saved_batch} (the data position is "
                "counted in batches)"
            )
        saved_seed = self._resumed.manifest.get("seed")
        if saved_seed is not None and self.seed is not None and saved_seed != self.seed:
            raise CheckpointError(
                f"{self._resumed.path} was trained with seed {saved_seed}, this run's is {self.seed}: "
                f"resume with --seed {saved_seed} (the batches of synthetic data and the shuffles follow it)"
            )
        self.start_step = self.last_saved = self._resumed.step
        if self.start_step > steps:
            raise CheckpointError(
                f"{self._resumed.path} is at step {self.start_step}, past this run's last step {steps}"
            )
        if self.start_step < steps and self._is_a_runs_best_folder():
            raise CheckpointError(
                f"--checkpoint-dir {self.directory}: the best evaluation's checkpoint of the run in "
                f"{self.directory.parent}, which only that run writes (this run's saves would join it, and "
                f"`export --checkpoint {self.directory}` would take the newest); to train on from it, copy it "
                f"into a directory of its own and resume there: cp -r {self._resumed.path} NEWDIR/, then "
                "--checkpoint-dir NEWDIR --resume"
            )
        self._resume_schedule()
        self._resume_early_stopping()
        for problem in kernel_choices.restore(self._resumed.manifest):
            self._say(f"warning: {self._resumed.path}: {problem}", sys.stderr)
        why = "torchrun restarted this job" if restarted else "--resume"
        self._say(f"resumed from {self._resumed.path} at step {self.start_step} ({why})")
        if self.start_step == steps and not restarted:
            self._say(f"note: step {steps} is this run's last: nothing is left to train (raise --steps to go on)")
        return self.start_step

    def _is_a_runs_best_folder(self) -> bool:
        """Whether --checkpoint-dir is DIR/best of a run in DIR (one that holds its lock file or checkpoints)."""
        assert self.directory is not None
        parent = self.directory.parent
        return self.directory.name == BEST_DIR and ((parent / LOCK_FILE).exists() or bool(complete_checkpoints(parent)))

    def _refuse_an_earlier_runs_checkpoints(self) -> None:
        """A new run's saves must not mix with another run's: `--keep` would prune the older run's
        (or its own, behind a later step of the other), a step both reach would be replaced, and
        a later `--resume` or torchrun restart would go on from whichever is newest."""
        assert self.directory is not None
        for folder in (self.directory, self.directory / BEST_DIR):
            found = complete_checkpoints(folder)
            if found:
                raise CheckpointError(
                    f"{self.directory} holds the checkpoints of an earlier run ({found[-1][1].name} the latest): "
                    "continue that run with --resume, or remove them or choose another --checkpoint-dir"
                )

    def _resume_schedule(self) -> None:
        """The learning-rate schedule goes on at the resumed step; a changed one is said."""
        assert self._resumed is not None
        saved = self._resumed.manifest.get("lr_schedule")
        if self.lr_scheduler is None or saved is None:
            return
        if not self.lr_scheduler.load_state_dict(saved):
            self._say(
                f"warning: {self._resumed.path} was trained with lr_schedule {spell(saved['schedule'])}; "
                f"this run goes on from step {self.start_step} with {spell(self.lr_scheduler.schedule.describe())}",
                sys.stderr,
            )

    def _resume_early_stopping(self) -> None:
        """The best evaluation so far and the passes since it, as the checkpoint kept them."""
        assert self._resumed is not None
        saved = self._resumed.manifest.get("early_stopping")
        if self.early_stopping is None or saved is None:
            return
        self.resumed_early_stopping = self.early_stopping.load_state_dict(saved)
        best = complete_checkpoints(self.directory / BEST_DIR) if self.directory is not None else []
        if self.resumed_early_stopping and best and best[-1][0] == self.early_stopping.best_step:
            self.best_path = best[-1][1]  # this run's result names it until a better one replaces it
        if not self.resumed_early_stopping:
            self._say(
                f"warning: {self._resumed.path} tracked --best-metric {saved.get('metric')}; this run tracks "
                f"{self.early_stopping.metric.name} from scratch",
                sys.stderr,
            )

    def resumed_vocabulary(self) -> Path | None:
        """The id vocabulary saved with the checkpoint this run resumed from, if it has one."""
        if self._resumed is None:
            return None
        path = self._resumed.path / VOCABULARY_FILE
        return path if path.is_file() else None

    def resumed_features(self) -> Path | None:
        """The learned feature state saved with the checkpoint this run resumed from, if it has one."""
        if self._resumed is None:
            return None
        path = self._resumed.path / FEATURES_FILE
        return path if path.is_file() else None

    def position(self, batches: Iterator[Batch], data: str | None) -> Iterator[Batch]:
        """`batches` of the worker's `--data` at the resumed data position.

        Synthetic batches are indexed by step: the worker starts them at
        `start_step`. Other iterators get their saved state (`load_state_dict`,
        same world size; prepared data's, a row, at any world size) or, failing
        that, the batches of the completed steps are drawn and dropped, which
        gives the same data order, slowly.
        """
        self._batches = batches
        if self.start_step == 0 or choose_data(data, self.module.INPUTS).reader == "synthetic":
            return batches
        saved = self._resumed.data_state if self._resumed is not None else None
        state_after = getattr(batches, "state_after", None)
        if saved is None and callable(state_after):
            # Another world size: the store keeps no rank's data state, but a position that is
            # a row (prepared data) follows from the step alone.
            saved = state_after(self.start_step)
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
        if self.directory is not None and self.last_saved != step:
            self.save(step)

    def close(self) -> None:
        """Release the directory's lock (rank 0); the process's exit does it too."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def save_best(self, step: int) -> None:
        """The model after `step`, the best evaluation so far, to DIR/best (replacing the one there)."""
        if self.directory is not None:
            self.best_path = self.save(step, best=True)

    def save(self, step: int, best: bool = False) -> Path:
        """Save the model after `step` to DIR, or with `best` to DIR/best (keeping only that one)."""
        assert self.directory is not None
        # The position after `step` batches, not the iterator's own: a pipeline has drawn batches ahead.
        state_after = getattr(self._batches, "state_after", None)
        state_dict = (lambda: state_after(step)) if callable(state_after) else getattr(self._batches, "state_dict", None)
        tracked = None if self.early_stopping is None else self.early_stopping.state_dict()
        kernels, differences = kernel_choices.gather(self.process_group)
        for difference in differences:
            self._say(f"warning: ranks chose kernels differently: {difference}", sys.stderr)
        with self.other_work.measure("checkpoint"):
            path = save_checkpoint(
                self.directory / BEST_DIR if best else self.directory,
                self.model,
                self.optimizer,
                step=step,
                spec_sha256=self.module.SPEC_SHA256,
                plan=self.module.PLAN,
                data_state=state_dict() if callable(state_dict) else None,
                batch_size=self.batch_size,
                seed=self.seed,
                keep=1 if best else self.keep,
                process_group=self.process_group,
                files=self._data_files(),
                lr_schedule=None if self.lr_scheduler is None else self.lr_scheduler.state_dict(step),
                early_stopping=tracked,
                kernels=kernels,
                damaged=() if best or self._resumed is None else self._resumed.damaged,
            )
        if not best:
            self.last_saved = step
        return path

    def _data_files(self) -> dict[str, bytes]:
        """The vocabulary the data reader maps ids with (`<module>.vocab.json`) and the learned feature
        state (`<module>.features.json`, runtime.train.feature_state), when there are."""
        files = {}
        for name, suffix in ((VOCABULARY_FILE, ".vocab.json"), (FEATURES_FILE, FEATURES_SUFFIX)):
            path = Path(self.module.__file__).with_suffix(suffix)
            if path.is_file():
                files[name] = path.read_bytes()
        return files

    def _say(self, line: str, stream: TextIO | None = None) -> None:
        if self.rank == 0:
            console.say(line, self.stream if stream is None else stream)
