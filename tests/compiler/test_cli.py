"""The `reccompile` entry point (compiler/cli.py): the first word, a closed stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["trian", "specs/x.yaml", "--steps", "1"],
            "error: 'trian' is neither a command (did you mean 'train'?) nor a spec file\n",
        ),
        (["schem"], "error: 'schem' is neither a command (did you mean 'schema'?) nor a spec file\n"),
        (["specs/no_such.yaml"], "error: 'specs/no_such.yaml' is neither a command nor a spec file\n"),
    ],
    ids=["mistyped train", "mistyped schema", "missing spec"],
)
def test_a_first_word_that_is_neither_a_command_nor_a_file_is_a_usage_error(argv, error: str, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr() == ("", error)


def test_an_existing_file_as_the_first_word_compiles_it(tmp_path: Path, capsys) -> None:
    assert main(["specs/dlrm_criteo.yaml", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "dlrm_criteo.py").is_file()


@pytest.mark.parametrize(
    ("argv", "listed"),
    [
        (
            ["train"],
            "--data DATA synthetic, criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH, prepared:DIR or PATH "
            "(default: the spec's)",
        ),
        (
            ["predict"],
            "--data DATA the samples: synthetic, criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH or PATH "
            "(default synthetic)",
        ),
        (
            ["retrieve"],
            "--data DATA the requests: synthetic, criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH or "
            "PATH (default synthetic)",
        ),
        (
            ["check"],
            "--data PATH check the first rows of this data against each spec: criteo:PATH, movielens:PATH, "
            "csv:PATH, parquet:PATH, prepared:DIR or PATH (the reader the spec names)",
        ),
        (["data", "prepare"], "--data READER:PATH the raw data: criteo:PATH, movielens:PATH, csv:PATH or parquet:PATH"),
    ],
)
def test_every_help_listing_the_readers_lists_all_of_them(argv: list[str], listed: str, capsys) -> None:
    assert main([*argv, "--help"]) == 0
    assert listed in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv", [["schema"], ["graph", "specs/dlrm_criteo.yaml"]])
def test_a_closed_stdout_stops_the_command_quietly_with_sigpipes_status(argv: list[str]) -> None:
    """`reccompile schema | head`: the reader is gone before the first write here."""
    command = subprocess.Popen(
        [sys.executable, "-m", "compiler.cli", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    command.stdout.close()
    stderr = command.stderr.read()
    assert (command.wait(timeout=120), stderr) == (141, b"")
