"""`reccompile train --pipeline / --no-pipeline`: the same losses either way, on by default for ranks > 1."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from compiler.cli import main
from runtime.train import options as train_options

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def _losses(tmp_path: Path, capsys, *options: str) -> list[str]:
    code = main(
        [
            "train",
            "specs/two_tower_movielens.yaml",
            "--steps",
            "5",
            "--batch-size",
            "64",
            "--log-every",
            "1",
            "-o",
            str(tmp_path),
            *options,
        ]
    )
    assert code == 0
    return [line.split()[3] for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]


def test_pipelined_and_plain_training_print_the_same_losses(tmp_path: Path, capsys) -> None:
    plain = _losses(tmp_path, capsys, "--no-pipeline")
    assert len(plain) == 5
    assert _losses(tmp_path, capsys, "--pipeline") == plain
    assert _losses(tmp_path, capsys, "--pipeline", "--pipeline-depth", "3") == plain


@pytest.mark.parametrize(
    ("options", "world_size", "depth"),
    [([], 1, 1), ([], 2, 2), (["--no-pipeline"], 2, 1), (["--pipeline"], 1, 2), (["--pipeline-depth", "3"], 4, 3)],
)
def test_the_pipeline_is_on_by_default_for_several_ranks(options: list[str], world_size: int, depth: int) -> None:
    parser = argparse.ArgumentParser()
    train_options.add_arguments(parser)
    chosen = train_options.from_args(parser.parse_args(options), module="m.py")
    assert chosen.pipeline_depth_for(world_size) == depth
    assert train_options.TrainOptions.from_json(chosen.to_json()) == chosen
