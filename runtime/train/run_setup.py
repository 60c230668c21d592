"""What a training run reads and reports: its data, evaluation, metrics, progress and logs.

The options live here, so the worker (`python -m runtime.train.worker`) and
`reccompile train` share one definition:

    --data synthetic|criteo:PATH|movielens:PATH|PATH   training data (default: the spec's data section)
    --eval-data ...        an evaluation split, scored every --eval-every steps and at the end
    --eval-every M         steps between evaluations (default 0: at the end only)
    --bad-rows fail|skip   stop at the first bad row (default) or count, skip and summarise them
    --log-dir DIR          metrics.jsonl and TensorBoard events as the run goes, metrics.png at the end
    --data-workers N       DataLoader worker processes per rank that parse the files (default 1)
    --rating-threshold T   MovieLens ratings >= T are positives for bce heads (default 4)

`setup_run` turns them into the batches to train on and the `TrainingMonitor`
whose hooks the training loop calls; `RunIO.finish` adds the final metrics
and the bad-row count to the run's last JSON line.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping

import torch
import torch.distributed as dist

from runtime.data.bad_rows import BAD_ROW_POLICIES, BadRowLog
from runtime.data.batch import Batch
from runtime.data.loader import epoch_batches, training_batches
from runtime.data.movielens import DEFAULT_THRESHOLD
from runtime.data.sources import choose_data, open_reader
from runtime.data.unseen_ids import UnseenIds, unseen_counter
from runtime.train.evaluate import evaluate
from runtime.reporting.monitor import TrainingMonitor
from runtime.reporting import console
from runtime.reporting.console import Console
from runtime.reporting.run_log import RunLog
from runtime.reporting.monitor import Evaluation

# (flag, argparse keywords); `reccompile train` passes each through when given.
OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--data", {"help": "synthetic, criteo:PATH, movielens:PATH or PATH (default: the spec's data section)"}),
    ("--eval-data", {"help": "an evaluation split, same forms as --data"}),
    ("--eval-every", {"type": int, "help": "steps between evaluations (default 0: at the end only)"}),
    ("--bad-rows", {"choices": BAD_ROW_POLICIES, "help": "stop at the first bad row (fail, default) or skip"}),
    ("--log-dir", {"type": Path, "help": "write metrics.jsonl, TensorBoard events and metrics.png here"}),
    ("--data-workers", {"type": int, "help": "DataLoader processes per rank parsing files (default 1)"}),
    ("--rating-threshold", {"type": float, "help": f"MovieLens: rating >= T is a positive ({DEFAULT_THRESHOLD:g})"}),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The data and reporting options (see the module docstring)."""
    for flag, keywords in OPTIONS:
        parser.add_argument(flag, **keywords)


def pass_through(args: argparse.Namespace) -> list[str]:
    """The worker arguments for the options given in `args`."""
    argv: list[str] = []
    for flag, _ in OPTIONS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            argv += [flag, str(value)]
    return argv


@dataclass
class RunIO:
    """The batches to train on, the monitor of the run, and the bad-row logs of its data."""

    batches: Iterator[Batch]
    monitor: TrainingMonitor
    bad_rows: dict[str, BadRowLog]  # "bad_rows" / "eval_bad_rows" -> its log (file readers only)
    rank: int
    unseen_ids: UnseenIds | None = None  # the training data's, when its reader has a vocabulary

    def finish(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """Final evaluation and metrics; skipped rows summarised on stderr (rank 0).

        Every rank meets the same bad rows (see runtime.data.bad_rows): no reduction needed.
        """
        if isinstance(self.batches, Generator):
            self.batches.close()  # stops the DataLoader workers now, not whenever it is collected
        self.monitor.final_evaluation()
        counts: dict[str, Any] = {key: log.bad for key, log in self.bad_rows.items()}
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
    args: argparse.Namespace,
    spec: Mapping[str, Any],
    *,
    model: torch.nn.Module,
    module_path: str,
    synthetic: Callable[[], Iterator[Batch]],
    steps: int,
    log_every: int,
    global_batch: int,
    rank: int,
    world_size: int,
    process_group: dist.ProcessGroup | None,
    device: torch.device | None,
) -> RunIO:
    """Open the training and evaluation data of `args` and the monitor of the run."""
    if args.eval_every is not None and args.eval_every < 0:
        raise ValueError(f"--eval-every must be 0 or more, got {args.eval_every}")
    if args.data_workers is not None and args.data_workers < 0:
        raise ValueError(f"--data-workers must be 0 or more, got {args.data_workers}")
    policy = args.bad_rows or "fail"
    workers = 1 if args.data_workers is None else args.data_workers
    threshold = DEFAULT_THRESHOLD if args.rating_threshold is None else args.rating_threshold
    warn = _warn if rank == 0 else None
    vocab_path = Path(module_path).with_suffix(".vocab.json")  # beside the module and its checkpoint
    shape = dict(global_batch=global_batch, rank=rank, world_size=world_size, num_workers=workers)

    unseen: UnseenIds | None = None  # ids outside the vocabulary (runtime.data.unseen_ids), MovieLens only
    bad_rows: dict[str, BadRowLog] = {}
    choice = choose_data(args.data, spec)
    reader = None
    if choice.reader == "synthetic":
        batches = synthetic()
    else:
        reader = open_reader(spec, choice, threshold=threshold, vocab_path=vocab_path, save_vocab=rank == 0)
        bad_rows["bad_rows"] = BadRowLog(policy, warn)
        unseen = unseen_counter(reader)
        batches = training_batches(reader, bad_rows=bad_rows["bad_rows"], unseen=unseen, **shape)

    evaluation: Callable[[], Evaluation] | None = None
    if args.eval_data is not None:
        vocabulary = getattr(reader, "vocabulary", None)  # the training vocabulary, when MovieLens
        eval_reader = open_reader(
            spec, choose_data(args.eval_data, spec), threshold=threshold, vocab_path=vocab_path,
            save_vocab=False, vocabulary=vocabulary,
        )  # fmt: skip
        bad_rows["eval_bad_rows"] = BadRowLog(policy, warn)  # counts add up over evaluations

        def evaluate_split() -> Evaluation:
            counted = unseen_counter(eval_reader)  # afresh for every pass
            local = epoch_batches(eval_reader, bad_rows=bad_rows["eval_bad_rows"], unseen=counted, **shape)
            return Evaluation(evaluate(model, local, spec["heads"], process_group, device), counted)

        evaluation = evaluate_split

    monitor = TrainingMonitor(
        spec["heads"],
        steps=steps,
        log_every=log_every,
        global_batch_size=global_batch,
        process_group=process_group,
        console=Console(steps) if rank == 0 else None,
        run_log=RunLog(args.log_dir) if rank == 0 and args.log_dir is not None else None,
        evaluation=evaluation,
        eval_every=args.eval_every or 0,
    )
    return RunIO(batches, monitor, bad_rows, rank, unseen)


_DATA_NAMES = {"bad_rows": "training data", "eval_bad_rows": "evaluation data"}


def _warn(message: str) -> None:
    console.say(f"warning: {message}", sys.stderr)
