"""runtime/train/options.py: every worker option checked once, at the command line.

Each usage error is one line on stderr and exit status 2, before anything
is compiled or started; with two ranks it is still printed once.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.cli import main
from runtime.config.training import TrainingConfig
from runtime.train import options as train_options
from runtime.train.options import TrainOptions

REPO = Path(__file__).resolve().parents[3]
SPEC = REPO / "specs" / "two_tower_movielens.yaml"  # training.batch_size 1024


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--log-every", "0"], "--log-every must be at least 1, got 0"),
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--steps", "-1"], "--steps must be at least 1, got -1"),
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--batch-size", "-8"], "--batch-size must be at least 1, got -8"),
        (["--batch-size", "3", "--nproc", "2"], "--batch-size 3 does not divide evenly over 2 ranks"),
        (
            ["--batch-size", "1", "--nproc", "2"],
            "--batch-size 1 is less than the 2 ranks: each rank needs at least one sample",
        ),
        (["--max-restarts", "-1"], "--max-restarts must be 0 or more, got -1"),
        (["--max-restarts", "two"], "--max-restarts must be a whole number, got 'two'"),
        (["--keep", "0", "--checkpoint-dir", "ck"], "--keep must be at least 1, got 0"),
        (["--checkpoint-every", "0", "--checkpoint-dir", "ck"], "--checkpoint-every must be at least 1, got 0"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--eval-every", "-1"], "--eval-every must be 0 or more, got -1"),
        (["--data-workers", "-2"], "--data-workers must be 0 or more, got -2"),
        (["--pipeline-depth", "0"], "--pipeline-depth must be at least 1, got 0"),
        (["--threads", "0"], "--threads must be at least 1, got 0"),
        (["--nproc", "0"], "--nproc must be at least 1, got 0"),
        (
            ["--world-size", "2"],
            "--world-size 2, but this run starts 1 rank (--nproc 1); "
            "train plans for the ranks it starts: leave --world-size out or make them agree",
        ),
        (
            ["--world-size", "2", "--nproc", "2", "--nnodes", "2"],
            "--world-size 2, but this run starts 4 ranks "
            "(--nproc 2 on --nnodes 2); train plans for the ranks it starts: leave --world-size out or make them agree",
        ),
        (["--best-metric", "auc"], "--best-metric auc needs --eval-data (the split it is measured on)"),
        (["--eval-every", "5"], "--eval-every 5 needs --eval-data (the split it evaluates)"),
        (
            ["--eval-data", "synthetic", "--eval-every", "5", "--patience", "2"],
            "--patience 2 needs --best-metric or the spec's training.early_stopping (the metric that must improve)",
        ),
        (
            ["--eval-data", "synthetic", "--best-metric", "auc", "--patience", "2"],
            "--patience 2 needs --eval-every K (evaluating only at the end cannot stop early)",
        ),
        (
            ["--eval-data", "synthetic", "--eval-every", "5", "--best-metric", "auc", "--patience", "0"],
            "--patience must be at least 1, got 0",
        ),
        (
            ["--data", "movielens:ml/ratings.dat", "--shuffle-window", "2"],
            "--shuffle-window 2: shuffles prepared data only, and movielens:ml/ratings.dat is read in its own order; "
            "prepare it once (reccompile data prepare SPEC --data movielens:ml/ratings.dat -o DIR) and train with "
            "--data prepared:DIR",
        ),
        (
            ["--shuffle-window", "1"],
            "--shuffle-window 1: shuffles prepared data only, and synthetic batches are made, not read",
        ),
        (
            ["--eval-data", "synthetic", "--best-metric", "recall@10"],
            "--best-metric 'recall@10': no head reports it; the heads' metrics are like.ne, like.auc, like.accuracy",
        ),
        (
            ["--eval-data", "synthetic", "--best-metric", "click.auc"],
            "--best-metric 'click.auc': no head reports it; the heads' metrics are like.ne, like.auc, like.accuracy",
        ),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(tmp_path: Path, capsys, options: list[str], message: str) -> None:
    assert main(["train", str(SPEC), "-o", str(tmp_path / "build"), *options]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"error: {message}\n")
    assert not (tmp_path / "build").exists()  # nothing compiled, nothing started


def test_o_naming_a_file_is_a_usage_error_for_compile_and_train(tmp_path: Path, capsys) -> None:
    existing = tmp_path / "build"
    existing.write_text("not a directory")
    for command in (["train", str(SPEC)], [str(SPEC)]):
        assert main([*command, "-o", str(existing)]) == 2
        assert capsys.readouterr().err == f"error: -o {existing}: exists and is not a directory\n"
    checkpoints = tmp_path / "ck"
    checkpoints.write_text("")
    assert main(["train", str(SPEC), "-o", str(tmp_path / "b"), "--checkpoint-dir", str(checkpoints)]) == 2
    assert capsys.readouterr().err == f"error: --checkpoint-dir {checkpoints}: exists and is not a directory\n"


def test_with_two_ranks_the_usage_error_is_printed_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compiler.cli",
            "train",
            str(SPEC),
            "--nproc",
            "2",
            "--batch-size",
            "1",
            "-o",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "error: --batch-size 1 is less than the 2 ranks: each rank needs at least one sample\n"


def test_options_fill_the_spec_defaults_and_travel_as_json() -> None:
    parser = argparse.ArgumentParser()
    train_options.add_arguments(parser)
    args = parser.parse_args(["--steps", "7", "--checkpoint-dir", "ck", "--keep", "2", "--no-pipeline"])
    options = train_options.from_args(args, module="build/m.py")
    assert options == TrainOptions(module="build/m.py", steps=7, checkpoint_dir=Path("ck"), keep=2, pipeline=False)
    ready = options.with_spec_defaults(TrainingConfig(steps=100, batch_size=64, seed=3))
    assert (ready.steps, ready.batch_size, ready.seed) == (7, 64, 3)
    assert TrainOptions.from_json(ready.to_json()) == ready
    assert ready.pipeline_depth_for(4) == 1 and options.pipeline_depth_for(1) == 1


def test_checkpoints_keep_the_newest_three_unless_told() -> None:
    parser = argparse.ArgumentParser()
    train_options.add_arguments(parser)
    assert train_options.from_args(parser.parse_args(["--checkpoint-dir", "ck"]), module="m.py").keep == 3
    assert train_options.from_args(parser.parse_args([]), module="m.py").keep == 3
    told = parser.parse_args(["--checkpoint-dir", "ck", "--keep", "10"])
    assert train_options.from_args(told, module="m.py").keep == 10
