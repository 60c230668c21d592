"""Tests for runtime/serving/predict.py's write_csv: whole or not at all, through a file of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.serving.predict import write_csv


def test_the_output_is_written_through_a_hidden_file_of_this_process_then_renamed(tmp_path: Path) -> None:
    output = tmp_path / "scores.csv"
    output.write_text("old\n")
    seen: list[str] = []

    def write(out) -> int:
        seen.extend(sorted(p.name for p in tmp_path.iterdir()))
        out.write("id,click\n1,0.5\n")
        return 1

    assert write_csv(output, write) == 1
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
        write_csv(output, write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.csv"]
    assert output.read_text() == "old\n"
