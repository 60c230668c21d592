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
from typing import Any, Callable, Iterator, Sequence, TextIO

import torch
import torch.distributed as dist

from runtime.checkpoint.files import complete_checkpoints
from runtime.checkpoint.lock import LOCK_FILE, DirectoryLock
from runtime.checkpoint.states import CheckpointStates, Stateful
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
from runtime.train.callbacks import Callback
from runtime.train.context import RunContext
from runtime.train.feature_state import SUFFIX as FEATURES_SUFFIX

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


class Checkpointing(Callback):
    """One worker's checkpoints: `resume()` before training; as a callback, saves every
    --checkpoint-every steps (`on_step_end`) and after the last step (`on_train_end`).

    What a checkpoint holds besides the model and the dense optimizer (whose state the
    store lays out itself) is the Stateful objects `register`ed under a name
    (runtime.checkpoint.states) before `resume`, which hands each its saved state; the data
    position is registered once the reader is open (`position`).
    Inactive (every method a no-op) without --checkpoint-dir.
    """

    def __init__(
        self,
        context: RunContext,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        stream: TextIO | None = None,
    ) -> None:
        options = context.options
        self.context = context
        self.directory: Path | None = options.checkpoint_dir
        self.every: int | None = options.checkpoint_every
        self.model, self.optimizer = model, optimizer
        self.states = CheckpointStates()
        self.stream = sys.stdout if stream is None else stream
        self.start_step = 0
        self.last_saved: int | None = None
        self.best_path: Path | None = None  # DIR/best/step_<N>, once this run saved one
        self._saving = 0  # the step of the save under way: the states taken as of it read it
        self._resumed: Resumed | None = None
        self._batches: Iterator[Batch] | None = None
        self._lock: DirectoryLock | None = None

    def register(self, name: str, state: Stateful, *, per_rank: bool = False) -> None:
        """Save `state` under `name` with every checkpoint (before `resume`, to be restored too)."""
        self.states.register(name, state, per_rank=per_rank)

    def saving_step(self) -> int:
        """The step of the save under way (states whose own counters run ahead take theirs as of it)."""
        return self._saving

    def resume(self) -> int:
        """Load the latest checkpoint if asked to or restarted by torchrun; the step to go on from.

        The checkpoint must not be past the run's last step.
        """
        if self.directory is None:
            return 0
        options, steps, process_group = self.context.options, self.context.steps, self.context.process_group
        if options.resume and not self.directory.is_dir():  # before the lock would create it
            raise CheckpointError(f"--resume: no complete checkpoint in {self.directory}: it does not exist")
        if self.context.rank == 0:
            self._lock = DirectoryLock(self.directory)
        restarted = restarted_by_torchrun(process_group)
        if not (options.resume or restarted):
            self._refuse_an_earlier_runs_checkpoints()
            return 0
        if latest_checkpoint(self.directory) is None:
            if options.resume:
                raise CheckpointError(f"--resume: no complete checkpoint in {self.directory}")
            return 0  # restarted before the first checkpoint: start afresh
        self._resumed = load_checkpoint(
            self.directory,
            self.model,
            self.optimizer,
            spec_sha256=self.context.spec_sha256,
            allow_spec_change=options.allow_spec_change,
            fall_back=True,
            process_group=process_group,
            states=self.states,
        )
        for reason in self._resumed.passed_over:
            self._say(f"warning: passed over a damaged checkpoint: {reason}", sys.stderr)
        if self._resumed.skipped:
            self._say(
                f"warning: {self._resumed.path} lacks {_some(self._resumed.skipped)}: those keep their "
                "fresh values (--allow-spec-change)",
                sys.stderr,
            )
        saved_batch = self._resumed.manifest.get("global_batch_size")
        if saved_batch is not None and saved_batch != self.context.global_batch:
            raise CheckpointError(
                f"{self._resumed.path} was trained with batch size {saved_batch}, this run's is "
                f"{self.context.global_batch}: resume with --batch-size {saved_batch} (the data position is "
                "counted in batches)"
            )
        saved_seed = self._resumed.manifest.get("seed")
        if saved_seed is not None and saved_seed != self.context.seed:
            raise CheckpointError(
                f"{self._resumed.path} was trained with seed {saved_seed}, this run's is {self.context.seed}: "
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
        for state in self.states.shared.values():  # what a state found at odds with this run
            for note in getattr(state, "load_notes", ()):
                self._say(f"warning: {self._resumed.path}{note}", sys.stderr)
        why = "torchrun restarted this job" if restarted else "--resume"
        self._say(f"resumed from {self._resumed.path} at step {self.start_step} ({why})")
        if self.start_step == steps and not restarted:
            self._say(f"note: step {steps} is this run's last: nothing is left to train (raise --steps to go on)")
        return self.start_step

    def found_best(self, step: int | None) -> None:
        """A resumed tracker's best is at `step`: DIR/best's checkpoint, if it is of that step, is this run's
        best until a better one replaces it."""
        best = complete_checkpoints(self.directory / BEST_DIR) if self.directory is not None else []
        if best and best[-1][0] == step:
            self.best_path = best[-1][1]

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

    def position(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """`batches` of the worker's `--data` at the resumed data position; their position is saved
        with every checkpoint from now on (each rank's, as its "data").

        Synthetic batches are indexed by step: the worker starts them at
        `start_step`. Other iterators get their saved state (`load_state_dict`,
        same world size; prepared data's, a row, at any world size) or, failing
        that, the batches of the completed steps are drawn and dropped, which
        gives the same data order, slowly.
        """
        self._batches = batches
        position = _DataPosition(batches, self.saving_step)
        if position.saved():
            self.register("data", position, per_rank=True)
        if self.start_step == 0 or choose_data(self.context.options.data, self.context.inputs).reader == "synthetic":
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

    def on_step_end(self, step: int, *_: Any) -> None:
        """Save every --checkpoint-every steps."""
        if self.directory is not None and self.every is not None and step % self.every == 0:
            self.save(step)

    def on_train_end(self, last_step: int) -> None:
        self.finish(last_step)

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
        context = self.context
        facts = {"global_batch_size": context.options.batch_size, "seed": context.options.seed}
        self._saving = step
        with context.other_work.measure("checkpoint"):
            path = save_checkpoint(
                self.directory / BEST_DIR if best else self.directory,
                self.model,
                self.optimizer,
                step=step,
                spec_sha256=context.spec_sha256,
                plan=context.plan,
                states=self.states,
                facts={name: value for name, value in facts.items() if value is not None},
                keep=1 if best else context.options.keep,
                process_group=context.process_group,
                files=self._data_files(),
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
            path = self.context.module_file.with_suffix(suffix)
            if path.is_file():
                files[name] = path.read_bytes()
        return files

    def _say(self, line: str, stream: TextIO | None = None) -> None:
        if self.context.rank == 0:
            console.say(line, self.stream if stream is None else stream)


class _DataPosition:
    """The batches' position as a checkpoint's per-rank state: after the batches the saved step's
    steps consumed (`state_after(step)`), not the iterator's own, since a pipeline draws ahead; an
    iterator without `state_after` gives its `state_dict()`."""

    def __init__(self, batches: Iterator[Batch], step: Callable[[], int]) -> None:
        self.batches, self.step = batches, step

    def saved(self) -> bool:
        """Whether the batches offer a position at all (else a checkpoint keeps None)."""
        return callable(getattr(self.batches, "state_after", None)) or callable(
            getattr(self.batches, "state_dict", None)
        )

    def state_dict(self) -> Any:
        state_after = getattr(self.batches, "state_after", None)
        if callable(state_after):
            return state_after(self.step())
        return self.batches.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state_dict: Any) -> None:
        self.batches.load_state_dict(state_dict)  # type: ignore[attr-defined]
