"""`predict` and `retrieve` refuse an `-o` that would overwrite their input (compiler/commands/common.py).

The check runs before the export is loaded, so the export directory here is
a stand-in whose files must come through untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compiler.cli import main

COMMANDS = ("predict", "retrieve")


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the working directory, with `exp/manifest.json` and `data/day_0.tsv`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "manifest.json").write_text("the export\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "day_0.tsv").write_text("the data\n")
    return tmp_path


def refused(command: str, data: str, output: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The error of `command exp --data DATA -o OUTPUT`, which must exit 2 and write nothing."""
    capsys.readouterr()
    assert main([command, "exp", "--data", data, "-o", output]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (Path("exp") / "manifest.json").read_text() == "the export\n"
    assert (Path("data") / "day_0.tsv").read_text() == "the data\n"
    return err


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_that_is_the_data_file_is_refused(work: Path, command: str, capsys) -> None:
    assert refused(command, "criteo:data/day_0.tsv", "data/../data/day_0.tsv", capsys) == (
        "error: -o data/../data/day_0.tsv: is the --data file data/day_0.tsv; writing it would destroy the input\n"
    )
    assert refused(command, "data/day_0.tsv", str(work / "data" / "day_0.tsv"), capsys) == (
        f"error: -o {work}/data/day_0.tsv: is the --data file data/day_0.tsv; writing it would destroy the input\n"
    )


@pytest.mark.parametrize("link", [os.symlink, os.link])
def test_an_output_linked_to_the_data_file_is_refused(work: Path, link, capsys) -> None:
    link(work / "data" / "day_0.tsv", work / "copy.tsv")
    assert refused("predict", "criteo:copy.tsv", "data/day_0.tsv", capsys) == (
        "error: -o data/day_0.tsv: is the --data file copy.tsv; writing it would destroy the input\n"
    )


def test_an_output_inside_the_export_directory_is_refused(work: Path, capsys) -> None:
    os.symlink(work / "exp", work / "exp_link")
    for output in ("exp/manifest.json", "exp/predictions.csv", "exp_link/manifest.json"):
        for command in COMMANDS:
            assert refused(command, "synthetic", output, capsys) == (
                f"error: -o {output}: inside the export directory exp; writing there would damage the export\n"
            )


def test_an_output_inside_a_data_directory_or_on_a_movies_file_is_refused(work: Path, capsys) -> None:
    assert refused("predict", "csv:data", "data/scores.csv", capsys) == (
        "error: -o data/scores.csv: inside the --data directory data, whose files are all read as data\n"
    )
    assert refused("retrieve", "movielens:data/day_0.tsv", "data/movies.dat", capsys) == (
        "error: -o data/movies.dat: is the --data file data/movies.dat; writing it would destroy the input\n"
    )
