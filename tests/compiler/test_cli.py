"""The `reccompile` entry point (compiler/cli.py): the first word, a closed stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.cli import main


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["trian", "specs/x.yaml", "--steps", "1"], "error: 'trian' is neither a command (did you mean 'train'?) nor a spec file\n"),
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
