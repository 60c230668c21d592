"""Tests of runtime/storage/output.py: outputs written whole or not at all, OSError said in one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from runtime.storage.output import OutputError, removed_on_error, write_file


def test_the_output_is_written_through_a_hidden_file_of_this_process_then_renamed(tmp_path: Path) -> None:
    output = tmp_path / "scores.csv"
    output.write_text("old\n")
    seen: list[str] = []

    def write(out) -> int:
        seen.extend(sorted(p.name for p in tmp_path.iterdir()))
        out.write("id,click\n1,0.5\n")
        return 1

    assert write_file(output, write) == 1
    assert seen == [f".scores.csv.{os.getpid()}.partial", "scores.csv"]
    assert output.read_text() == "id,click\n1,0.5\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.csv"]


def test_a_failed_write_leaves_the_old_output_and_no_partial_file(tmp_path: Path) -> None:
    output = tmp_path / "scores.csv"
    output.write_text("old\n")

    def write(out) -> None:
        out.write("id,click\n")
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="^bad row$"):
        write_file(output, write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.csv"]
    assert output.read_text() == "old\n"


def test_an_oserror_while_writing_is_one_line_naming_the_file_and_leaves_the_old_output(tmp_path: Path) -> None:
    output = tmp_path / "scores.csv"
    output.write_text("old\n")

    def write(out) -> None:
        out.write("id,click\n")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OutputError) as refused:
        write_file(output, write)
    assert str(refused.value) == f"cannot write {output}: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.csv"]
    assert output.read_text() == "old\n"


def test_what_a_failed_write_created_goes_and_what_was_there_stays(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "old.txt").write_text("old")
    made = tmp_path / "out"
    with pytest.raises(OutputError) as refused:
        with removed_on_error(made, made / "train", tmp_path / "kept"):
            (made / "train").mkdir(parents=True)
            (made / "train" / "ratings.dat").write_text("1::2::5::3\n")
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(made / "test"))
    assert str(refused.value) == f"cannot write {made}: Read-only file system"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert (tmp_path / "kept" / "old.txt").read_text() == "old"
