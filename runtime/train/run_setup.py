"""What a training run reads and reports: its data, evaluation, metrics, progress and logs.

`setup_run` turns the data and reporting fields of a run's `TrainOptions` (see
runtime.train.options and runtime.train.context) into the batches to train on and the
`TrainingMonitor`, whose hooks the training loop calls as a callback (`MonitorHooks`); `RunIO.finish` adds
the final metrics, the bad-row count and, for MovieLens, the ids outside the
vocabulary (runtime.data.checks.unseen_ids) to the run's last JSON line.
Evaluation passes are timed apart from training (runtime.train.timing).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from runtime.config.data import ModelInputs
from runtime.data.batch import Batch
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.checks.history_lengths import length_warnings, prepared_lengths, reader_lengths, sequence_features
from runtime.data.checks.unseen_ids import UnseenIds, unseen_counter
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches, training_batches
from runtime.data.movielens.reader import movielens_layout
from runtime.data.movielens.vocab import Vocabulary, read_vocabulary
from runtime.data.prepared.batches import PreparedBatches, prepared_epoch_batches
from runtime.data.prepared.prepare import VOCABULARY
from runtime.data.prepared.reading import PreparedData, open_prepared
from runtime.data.sources import DataChoice, choose_data, open_reader
from runtime.reporting import console
from runtime.reporting.console import Console
from runtime.reporting.monitor import Evaluation, StepLog, TrainingMonitor
from runtime.reporting.run_log import RunLog
from runtime.train.callbacks import Callback
from runtime.train.context import RunContext
from runtime.train.evaluate import evaluate, training_catalogue
from runtime.train.feature_state import learned_inputs
from runtime.train.options import TrainOptions


class MonitorHooks(Callback):
    """The monitor as the loop's callback: metrics, progress and evaluation after every step, the
    step lines on log steps."""

    def __init__(self, monitor: TrainingMonitor) -> None:
        self.monitor = monitor

    def on_step_end(self, step: int, batch: Batch, outputs: Mapping[str, torch.Tensor], loss: torch.Tensor) -> None:
        self.monitor.on_step(step, batch, outputs, loss)

    def on_log(self, entry: StepLog) -> None:
        self.monitor.on_log(entry)


@dataclass
class RunIO:
    """The batches to train on, the monitor of the run, and the bad-row logs of its data."""

    batches: Iterator[Batch]
    monitor: TrainingMonitor
    bad_rows: dict[str, BadRowLog]  # "bad_rows" / "eval_bad_rows" -> its log (file readers only)
    rank: int
    unseen_ids: UnseenIds | None = None  # the training data's, when its reader has a vocabulary

    def finish(
        self, summary: Mapping[str, Any], after_evaluation: Callable[[], Mapping[str, Any]] | None = None
    ) -> dict[str, Any]:
        """Final evaluation and metrics; skipped rows summarised on stderr (rank 0).

        `after_evaluation` adds what the final evaluation decides (the best checkpoint).

        Every rank meets the same bad rows (see runtime.data.checks.bad_rows): no reduction needed.
        """
        close = getattr(self.batches, "close", None)
        if callable(close):
            close()  # stops the DataLoader workers now, not whenever the batches are collected
        self.monitor.final_evaluation()
        counts: dict[str, Any] = {key: log.bad for key, log in self.bad_rows.items()}
        if after_evaluation is not None:
            counts.update(after_evaluation())
        if self.unseen_ids is not None:
            counts["unseen_ids"] = self.unseen_ids.counts
        final = self.monitor.finish({**summary, **counts})
        if self.rank == 0 and self.unseen_ids is not None:
            console.say(f"training data: {self.unseen_ids.describe()}")
        if self.rank == 0:
            for key, log in self.bad_rows.items():
                report = log.summary()
                if report is not None:
                    console.say(f"{_DATA_NAMES[key]}: {report}", sys.stderr)
        return final


def setup_run(
    context: RunContext,
    model: torch.nn.Module,
    synthetic: Callable[[], Iterator[Batch]],
    *,
    resumed_vocabulary: Path | None = None,
    resumed_features: Path | None = None,
    on_evaluation: Callable[[int, Mapping[str, Any]], None] | None = None,
) -> RunIO:
    """Open the training and evaluation data of the run's options and the monitor of the run.

    `synthetic()`: the batches of synthetic data, from the step the run starts at.
    `resumed_vocabulary`: the vocabulary saved with the checkpoint this run resumed
    from. The tables' rows mean its ids, so the reader maps ids with it whatever
    file the run now reads (ids it lacks are counted as unseen), and it stays
    beside the module for the checkpoints this run writes.
    `resumed_features`: the learned feature state saved with that checkpoint; without it the
    state comes from prepared data or is learned now (runtime.train.feature_state), and both
    the training and the evaluation data are read with it.
    `on_evaluation(step, metrics)` follows every evaluation pass (the callbacks' `on_eval`).
    """
    options, inputs, rank, world_size = context.options, context.inputs, context.rank, context.world_size
    process_group, device, other_work = context.process_group, context.device, context.other_work
    steps, log_every, global_batch = context.steps, context.log_every, context.global_batch
    policy, workers, threshold = options.bad_rows, options.data_workers, options.rating_threshold
    warn = _warn if rank == 0 else None
    vocab_path = Path(options.module).with_suffix(".vocab.json")  # beside the module and its checkpoint
    shape = dict(global_batch=global_batch, rank=rank, world_size=world_size, num_workers=workers)

    unseen: UnseenIds | None = None  # ids outside the vocabulary (runtime.data.checks.unseen_ids), MovieLens only
    bad_rows: dict[str, BadRowLog] = {}
    choice = choose_data(options.data, inputs)
    inputs = learned_inputs(
        inputs, choice, module_file=options.module, resumed=resumed_features, rank=rank, process_group=process_group
    )
    reader = None
    trained: Vocabulary | None = None  # the MovieLens vocabulary the tables' rows mean
    batches: Iterator[Batch]
    # rank 0 compares the sequence features' mean lengths in training and evaluation rows
    compare_lengths = warn is not None and options.eval_data is not None and bool(sequence_features(inputs))
    lengths: dict[str, float] = {}
    eval_lengths: dict[str, float] = {}
    if choice.reader == "synthetic":
        batches = synthetic()
    elif choice.reader == "prepared":
        prepared = _open_prepared(inputs, choice, options, global_batch, world_size, warn)
        saved = resumed_vocabulary or prepared.manifest.directory / VOCABULARY
        trained = read_vocabulary(saved) if saved.is_file() else None
        if rank == 0 and resumed_vocabulary is None:
            _copy_vocabulary(prepared, vocab_path)
        batches = PreparedBatches(prepared, **shape, on_wrap=_wrapped(choice) if rank == 0 else None)
        if compare_lengths:
            lengths = prepared_lengths(prepared.manifest.columns, sequence_features(inputs))
    else:
        trained = None if resumed_vocabulary is None else read_vocabulary(resumed_vocabulary)
        if trained is not None and rank == 0:
            _replace_file(vocab_path, resumed_vocabulary.read_bytes())
        reader = open_reader(
            inputs, choice, threshold=threshold, vocab_path=vocab_path, save_vocab=rank == 0, vocabulary=trained
        )
        trained = getattr(reader, "vocabulary", None)
        bad_rows["bad_rows"] = BadRowLog(policy, warn)
        unseen = unseen_counter(reader)
        on_wrap = _wrapped(choice) if rank == 0 else None
        batches = training_batches(reader, bad_rows=bad_rows["bad_rows"], unseen=unseen, on_wrap=on_wrap, **shape)
        if compare_lengths:
            lengths = reader_lengths(reader, sequence_features(inputs))

    evaluation: Callable[[], Evaluation] | None = None
    eval_choice = None if options.eval_data is None else choose_data(options.eval_data, inputs)
    if eval_choice is not None and eval_choice.reader == "prepared":
        eval_prepared = _open_prepared(
            inputs, eval_choice, dataclasses.replace(options, shuffle_window=0), global_batch, world_size, warn
        )
        _check_eval_vocabulary(eval_prepared, trained, eval_choice)
        if compare_lengths:
            eval_lengths = prepared_lengths(eval_prepared.manifest.columns, sequence_features(inputs))

        def evaluate_prepared() -> Evaluation:
            with other_work.measure("eval"):
                local = prepared_epoch_batches(eval_prepared, **shape)
                return Evaluation(evaluate(model, local, inputs.heads, process_group, device), None)

        evaluation = evaluate_prepared
    elif eval_choice is not None:
        if reader is None and eval_choice.reader == "movielens" and movielens_layout(inputs).history is not None:
            raise DataError(
                f"--eval-data {eval_choice}: the spec's history starts in the training ratings, which "
                f"{choice} does not keep; prepare the evaluation data with `reccompile data prepare SPEC --data "
                f"{eval_choice} --training movielens:<the training ratings>` and pass --eval-data prepared:DIR"
            )
        eval_reader = open_reader(
            inputs,
            eval_choice,
            threshold=threshold,
            vocab_path=vocab_path,
            save_vocab=False,
            vocabulary=trained,
            training=reader,
            held_out=True,
        )
        bad_rows["eval_bad_rows"] = BadRowLog(policy, warn)  # counts add up over evaluations
        if compare_lengths:
            eval_lengths = reader_lengths(eval_reader, sequence_features(inputs))

        def evaluate_split() -> Evaluation:
            with other_work.measure("eval"):
                counted = unseen_counter(eval_reader)  # afresh for every pass
                local = epoch_batches(eval_reader, bad_rows=bad_rows["eval_bad_rows"], unseen=counted, **shape)
                return Evaluation(evaluate(model, local, inputs.heads, process_group, device), counted)

        evaluation = evaluate_split

    if warn is not None:  # sequence features much longer in evaluation than in training (or shorter)
        for message in length_warnings(lengths, eval_lengths, str(choice), str(eval_choice)):
            warn(message)
    monitor = TrainingMonitor(
        inputs.heads,
        steps=steps,
        log_every=log_every,
        global_batch_size=global_batch,
        process_group=process_group,
        console=Console(steps) if rank == 0 else None,
        run_log=RunLog(options.log_dir) if rank == 0 and options.log_dir is not None else None,
        evaluation=evaluation,
        eval_every=options.eval_every,
        on_evaluation=on_evaluation,
        catalogue=training_catalogue(model),
    )
    return RunIO(batches, monitor, bad_rows, rank, unseen)


def _open_prepared(
    inputs: ModelInputs,
    choice: DataChoice,
    options: TrainOptions,
    global_batch: int,
    world_size: int,
    warn: Callable[[str], None] | None,
) -> PreparedData:
    """The prepared data of `choice`, checked against the spec; a warning when ranks would share row groups."""
    window = options.shuffle_window
    prepared = open_prepared(inputs, choice.path or "", seed=options.seed if window else None, window=window)
    share, group = global_batch // world_size, prepared.manifest.row_group_rows
    if warn is not None and share % group != 0:
        warn(
            f"{choice}: row groups of {group:,} rows do not divide a rank's {share:,} rows of a batch, so ranks "
            f"decode row groups they share; prepare with a --row-group-rows that divides {share:,} to read rows / N"
        )
    return prepared


def _check_eval_vocabulary(prepared: PreparedData, trained: Vocabulary | None, choice: DataChoice) -> None:
    """Prepared MovieLens evaluation data must map ids as the training data does (prepared with --training)."""
    saved = prepared.manifest.directory / VOCABULARY
    if trained is None or not saved.is_file():
        return  # not MovieLens, or no training vocabulary to hold it to (synthetic training)
    mapped = read_vocabulary(saved)
    moved = []
    sides = (("users", mapped.users, trained.user_row), ("movies", mapped.movies, trained.movie_row))
    for what, ids, trained_row in sides:
        count = sum(trained_row(id_) != row for id_, row in ids.items())  # an id training never saw: row 0 there
        if count:
            moved.append(f"{count:,} of its {len(ids):,} {what}")
    genres = (trained.genres, trained.movie_genres) != (mapped.genres, mapped.movie_genres)
    if genres and trained.genres and mapped.genres:  # a vocabulary saved before genres were kept has none
        moved.append("its genres")
    if moved:
        raise DataError(
            f"--eval-data {choice}: its MovieLens ids were mapped with another vocabulary than the training data's "
            f"({' and '.join(moved)} on other rows); prepare it again with --training movielens:<the training ratings>"
        )


def _copy_vocabulary(prepared: PreparedData, vocab_path: Path) -> None:
    """The MovieLens vocabulary the data was prepared with, beside the module: checkpoints carry it."""
    saved = prepared.manifest.directory / VOCABULARY
    if saved.is_file():
        _replace_file(vocab_path, saved.read_bytes())


_DATA_NAMES = {"bad_rows": "training data", "eval_bad_rows": "evaluation data"}


def _wrapped(choice: DataChoice) -> Callable[[int, int], None]:
    """The line that says training has read its data to the end and reads it again (stderr, beside the
    bad-row summary: stdout keeps the step lines and the result)."""

    def say(passes: int, step: int) -> None:
        console.say(
            f"training data {choice}: read to its end at step {step:,}; starting again from its "
            f"beginning (pass {passes})",
            sys.stderr,
        )

    return say


def _warn(message: str) -> None:
    console.say(f"warning: {message}", sys.stderr)


def _replace_file(path: Path, content: bytes) -> None:
    """Write `path` whole or not at all (a reader never sees half a file)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(content)
    temporary.replace(path)
