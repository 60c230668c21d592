"""Every option of a training worker in one frozen `TrainOptions`, checked once.

`reccompile train` builds it from its command line (`add_arguments`,
`from_args`: every usage error is a `UsageError` with one line naming the
flag and the value), fills the spec's defaults in (`with_spec_defaults`),
and hands it to the workers: in-process for one rank, as
JSON on the worker's command line under torchrun (`to_json`, `from_json`).
The worker trusts what it receives and checks nothing again.

    --steps S, --batch-size B (global), --seed X, --log-every K
    --data, --eval-data, --eval-every M, --bad-rows, --log-dir, --data-workers N, --rating-threshold T
    --shuffle-window K  prepared data: shuffle every epoch, rows within windows of K row groups
    --checkpoint-dir DIR, --checkpoint-every K, --keep N, --resume, --allow-spec-change
    --best-metric NAME  keep the best evaluation's checkpoint in DIR/best (runtime.train.early_stopping)
    --patience P        stop after P evaluations without a gain of --best-metric
    --pipeline / --no-pipeline, --pipeline-depth D
    --threads N        torch intra-op threads per rank (default: from the cores free at launch)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from runtime.checkpoint.files import is_checkpoint
from runtime.config.training import TrainingConfig
from runtime.data.checks.bad_rows import BAD_ROW_POLICIES
from runtime.data.movielens.reader import DEFAULT_THRESHOLD
from runtime.data.reader_names import data_forms
from runtime.train.limits import (
    MAX_BATCH_SIZE,
    MAX_PIPELINE_DEPTH,
    MAX_PROCESSES,
    MAX_SEED,
    MAX_THREADS,
    range_problem,
)

DEFAULT_KEEP = 3  # enough to fall back past a damaged newest checkpoint, not every one of a long run


class UsageError(ValueError):
    """A training option that cannot work; the message names the flag and its value."""


@dataclass(frozen=True)
class TrainOptions:
    """What one training run was asked to do; `None` steps, batch size and seed mean the spec's."""

    module: str  # the generated module's path
    steps: int | None = None
    batch_size: int | None = None  # global: each of N ranks trains batch_size / N samples
    seed: int | None = None
    log_every: int = 10
    data: str | None = None  # READER:PATH, synthetic or PATH (runtime.data.sources); None: the spec's
    eval_data: str | None = None
    eval_every: int = 0  # 0: evaluate at the end only
    bad_rows: str = "fail"
    log_dir: Path | None = None
    data_workers: int = 1  # DataLoader processes per rank parsing files
    rating_threshold: float = DEFAULT_THRESHOLD
    shuffle_window: int = 0  # prepared data: 0 keeps the prepared order
    checkpoint_dir: Path | None = None
    checkpoint_every: int | None = None  # None: save after the last step only
    keep: int = DEFAULT_KEEP  # the newest K checkpoints stay; older ones are removed after each save
    resume: bool = False
    allow_spec_change: bool = False
    best_metric: str | None = None  # `metric` or `head.metric` of the evaluation split
    patience: int | None = None  # None: never stop early
    pipeline: bool | None = None  # None: pipelined when there are several ranks
    pipeline_depth: int = 2
    threads: int | None = None  # None: torch's default

    def pipeline_depth_for(self, world_size: int) -> int:
        """Batches in flight: 1 (the plain loop) unless pipelined."""
        pipelined = self.pipeline if self.pipeline is not None else world_size > 1
        return self.pipeline_depth if pipelined else 1

    def with_spec_defaults(self, training: TrainingConfig) -> TrainOptions:
        """These options with the spec's `training` steps, batch size, seed and early stopping where
        none was given; the spec's early stopping only where it can apply (`spec_early_stopping_unused`)."""
        stopping = self.best_metric is None and self.spec_early_stopping_unused(training) is None
        return dataclasses.replace(
            self,
            steps=self.steps if self.steps is not None else training.steps,
            batch_size=self.batch_size if self.batch_size is not None else training.batch_size,
            seed=self.seed if self.seed is not None else training.seed,
            best_metric=training.best_metric if stopping else self.best_metric,
            patience=training.patience if stopping and self.patience is None else self.patience,
        )

    def spec_early_stopping_unused(self, training: TrainingConfig) -> str | None:
        """Why the spec's `training.early_stopping` cannot apply to this run, or None when it can
        (or there is none, or --best-metric replaces it)."""
        if training.best_metric is None or self.best_metric is not None:
            return None
        where = f"training.early_stopping ({training.early_stopping_where})"
        if self.eval_data is None:
            return f"{where} is not applied: there is no --eval-data to measure {training.best_metric} on"
        if training.patience is not None and self.patience is None and not self.eval_every:
            return f"{where} is not applied: its patience needs --eval-every K"
        return None

    def to_json(self) -> str:
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()})

    @classmethod
    def from_json(cls, text: str) -> TrainOptions:
        values = json.loads(text)
        for key in ("log_dir", "checkpoint_dir"):
            if values[key] is not None:
                values[key] = Path(values[key])
        return cls(**values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's options (the module path excepted), in groups, on `parser`."""
    run = parser.add_argument_group("training run")
    run.add_argument("--steps", type=int, help="default: the spec's training.steps")
    run.add_argument("--batch-size", type=int, help=f"global batch size, 1 to {MAX_BATCH_SIZE:,} (default: the spec's)")
    run.add_argument("--seed", type=int, help=f"0 to {MAX_SEED:,} (default: the spec's training.seed)")
    run.add_argument("--log-every", type=int, default=10, help="steps between progress lines (default 10)")
    run.add_argument("--threads", type=int, help="torch threads per rank (default: from the cores free)")
    data = parser.add_argument_group("data and reporting")
    data.add_argument("--data", help=f"{data_forms(bare='PATH')} (default: the spec's)")
    data.add_argument("--eval-data", help="an evaluation split, same forms as --data")
    data.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: at the end)")
    data.add_argument(
        "--bad-rows", choices=BAD_ROW_POLICIES, default="fail", help="stop at the first bad row (fail, default) or skip"
    )
    data.add_argument("--log-dir", type=Path, help="write metrics.jsonl and metrics.png here")
    data.add_argument("--data-workers", type=int, default=1, help="DataLoader processes per rank (default 1)")
    data.add_argument(
        "--rating-threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"MovieLens: rating >= T is a positive ({DEFAULT_THRESHOLD:g})",
    )
    data.add_argument(
        "--shuffle-window",
        type=int,
        default=0,
        help="prepared data: shuffle each epoch (seeded), rows within windows of K row groups "
        "(0, default: the prepared order)",
    )
    checkpoints = parser.add_argument_group("checkpoints")
    checkpoints.add_argument("--checkpoint-dir", type=Path, help="save to DIR/step_<N> (after the last step)")
    checkpoints.add_argument("--checkpoint-every", type=int, help="also save every K steps")
    checkpoints.add_argument("--keep", type=int, help=f"keep only the newest K checkpoints (default: {DEFAULT_KEEP})")
    checkpoints.add_argument("--resume", action="store_true", help="start from the latest checkpoint in DIR")
    checkpoints.add_argument("--allow-spec-change", action="store_true", help="resume from another spec's checkpoint")
    best = parser.add_argument_group("early stopping")
    best.add_argument(
        "--best-metric",
        metavar="NAME",
        help="the eval metric (auc, ne, head.metric ...) whose best pass is kept in "
        "CHECKPOINT_DIR/best; lower is better for ne, log_loss, mse, rmse, loss",
    )
    best.add_argument("--patience", type=int, help="stop after P evaluations without a gain of --best-metric")
    pipelining = parser.add_argument_group("training pipeline")
    pipelining.add_argument(
        "--pipeline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="overlap the next batch's input_dist with this batch's step (default: on when there are several ranks)",
    )
    pipelining.add_argument("--pipeline-depth", type=int, default=2, help="batches in flight (default 2)")


def from_args(args: argparse.Namespace, module: str | Path, world_size: int = 1) -> TrainOptions:
    """The options of a parsed command line for `world_size` ranks; UsageError for the first that cannot work.

    (The spec's own batch size is checked against the world size by the compiler.)
    """
    for flag, least in (
        ("--steps", 1),
        ("--batch-size", 1),
        ("--log-every", 1),
        ("--threads", 1),
        ("--eval-every", 0),
        ("--data-workers", 0),
        ("--shuffle-window", 0),
        ("--checkpoint-every", 1),
        ("--keep", 1),
        ("--pipeline-depth", 1),
        ("--patience", 1),
    ):
        value = getattr(args, _dest(flag))
        if value is not None and value < least:
            bound = "at least 1" if least == 1 else "0 or more"
            raise UsageError(f"{flag} must be {bound}, got {value}")
    for flag, least, most in (
        ("--batch-size", 1, MAX_BATCH_SIZE),
        ("--seed", 0, MAX_SEED),
        ("--threads", 1, MAX_THREADS),
        ("--data-workers", 0, MAX_PROCESSES),
        ("--pipeline-depth", 1, MAX_PIPELINE_DEPTH),
    ):
        value = getattr(args, _dest(flag))
        problem = None if value is None else range_problem(flag, value, least, most)
        if problem is not None:
            raise UsageError(problem)
    if args.batch_size is not None and args.batch_size < world_size:
        raise UsageError(
            f"--batch-size {args.batch_size} is less than the {world_size} ranks: each rank needs at least one sample"
        )
    if args.batch_size is not None and args.batch_size % world_size != 0:
        raise UsageError(f"--batch-size {args.batch_size} does not divide evenly over {world_size} ranks")
    if args.checkpoint_dir is None:
        for flag in ("--checkpoint-every", "--keep", "--resume", "--allow-spec-change"):
            if getattr(args, _dest(flag)) not in (None, False):
                raise UsageError(f"{flag} needs --checkpoint-dir")
    elif args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
        raise UsageError(f"--checkpoint-dir {args.checkpoint_dir}: exists and is not a directory")
    elif is_checkpoint(args.checkpoint_dir):
        raise UsageError(
            f"--checkpoint-dir {args.checkpoint_dir} is one checkpoint; give the folder that holds the "
            f"step_<N> checkpoints: {args.checkpoint_dir.parent}"
        )
    fields = {f.name for f in dataclasses.fields(TrainOptions)} - {"module"}
    values = {name: getattr(args, name) for name in fields}
    if values["keep"] is None:
        values["keep"] = DEFAULT_KEEP
    return TrainOptions(module=str(module), **values)


def check_early_stopping(options: TrainOptions) -> None:
    """After the spec's defaults: --eval-every and --best-metric need an evaluation split, --patience
    a metric and periodic evaluation; UsageError for the first that is missing."""
    if options.eval_every and options.eval_data is None:
        raise UsageError(f"--eval-every {options.eval_every} needs --eval-data (the split it evaluates)")
    if options.best_metric is not None and options.eval_data is None:
        raise UsageError(f"--best-metric {options.best_metric} needs --eval-data (the split it is measured on)")
    if options.patience is not None and options.best_metric is None:
        raise UsageError(
            f"--patience {options.patience} needs --best-metric or the spec's training.early_stopping "
            "(the metric that must improve)"
        )
    if options.patience is not None and not options.eval_every:
        raise UsageError(
            f"--patience {options.patience} needs --eval-every K (evaluating only at the end cannot stop early)"
        )


def check_shuffle_window(options: TrainOptions, data: str) -> None:
    """--shuffle-window shuffles prepared data (runtime.data.prepared.batches) only: raw files and
    synthetic batches are read in their order, so the flag on them is a UsageError, not ignored."""
    if options.shuffle_window and data == "synthetic":
        raise UsageError(
            f"--shuffle-window {options.shuffle_window}: shuffles prepared data only, and synthetic "
            "batches are made, not read"
        )
    if options.shuffle_window and not data.startswith("prepared:"):
        raise UsageError(
            f"--shuffle-window {options.shuffle_window}: shuffles prepared data only, and {data} is read in "
            f"its own order; prepare it once (reccompile data prepare SPEC --data {data} -o DIR) and train "
            "with --data prepared:DIR"
        )


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
