"""runtime/data/prepared/parsing.py: how many processes parse a prepare's files, chosen by files and cores."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import runtime.data.prepared.parsing as parsing
import runtime.data.prepared.prepare as prepare_module
from runtime.data.prepared.manifest import file_sha256, write_json_atomically
from runtime.data.prepared.parsing import ParseChoice, choose_parsing
from runtime.data.prepared.prepare import PrepareSettings, prepare
from runtime.data.sources import DataChoice
from sample_files import criteo_lines, criteo_spec, write_lines

SETTINGS = PrepareSettings(row_group_rows=16, part_row_groups=3, block_lines=50)  # workers: the default


@pytest.fixture
def data(tmp_path: Path) -> dict[int, Path]:
    """One Criteo file, and a directory of three."""
    for i, rows in enumerate((100, 110, 90)):
        write_lines(tmp_path / "days" / f"day_{i}", criteo_lines(rows, seed=i + 1))
    return {1: write_lines(tmp_path / "one" / "day_0", criteo_lines(120, seed=7)), 3: tmp_path / "days"}


@pytest.mark.parametrize(
    ("cores", "files", "processes", "by_file", "said"),
    [
        (
            1,
            1,
            0,
            False,
            "line by line in this process (1 file on 1 usable core: one process per file needs 2 or more files)",
        ),
        (
            1,
            3,
            0,
            False,
            "line by line in this process (3 files on 1 usable core: one process per file needs 3 or more)",
        ),
        (
            2,
            1,
            0,
            False,
            "line by line in this process (1 file on 2 usable cores: one process per file needs 2 or more files)",
        ),
        (
            2,
            3,
            0,
            False,
            "line by line in this process (3 files on 2 usable cores: one process per file needs 3 or more)",
        ),
        (
            4,
            1,
            0,
            False,
            "line by line in this process (1 file on 4 usable cores: one process per file needs 2 or more files)",
        ),
        (
            4,
            3,
            3,
            True,
            "with 3 parse processes, one per file (3 files on 4 usable cores: one kept for writing the parts)",
        ),
    ],
)
def test_the_default_parses_one_process_per_file_only_with_several_files_and_three_cores(
    data: dict[int, Path],
    tmp_path: Path,
    monkeypatch,
    cores: int,
    files: int,
    processes: int,
    by_file: bool,
    said: str,
) -> None:
    monkeypatch.setattr(parsing, "usable_cores", lambda: cores)
    pools: list[int] = []

    class CountedParts(prepare_module.FileParts):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            pools.append(self.workers)

    monkeypatch.setattr(prepare_module, "FileParts", CountedParts)
    reported: list[str] = []
    manifest = prepare(
        criteo_spec(rows=1000),
        DataChoice("criteo", str(data[files])),
        tmp_path / "out",
        SETTINGS,
        report=reported.append,
    )
    assert reported == [f"parsing {said}"]
    assert pools == ([processes] if by_file else [])
    assert manifest.rows == (300 if files == 3 else 120)


def test_given_workers_are_taken_as_given() -> None:
    assert choose_parsing(3, 2) == ParseChoice(2, True, "--workers 2, 3 files")
    assert choose_parsing(2, 5).describe() == "with 2 parse processes, one per file (--workers 5, 2 files)"
    assert choose_parsing(1, 2).describe() == "with 2 parse processes, sharing the lines of the file (--workers 2)"
    assert choose_parsing(3, 0).describe() == "line by line in this process (--workers 0)"


def test_a_stopped_prepare_is_continued_by_default_in_the_mode_it_started_in(
    data: dict[int, Path], tmp_path: Path, monkeypatch
) -> None:
    inputs, choice = criteo_spec(rows=1000), DataChoice("criteo", str(data[3]))
    whole = tmp_path / "whole"
    prepare(inputs, choice, whole, dataclasses.replace(SETTINGS, workers=0))

    def journal_then_stop(path: Path, journal: dict) -> None:
        write_json_atomically(path, journal)
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "write_json_atomically", journal_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, choice, tmp_path / "out", dataclasses.replace(SETTINGS, workers=2))
    monkeypatch.undo()
    assert json.loads((tmp_path / "out" / ".prepare.json").read_text())["by_file"] is True
    monkeypatch.setattr(parsing, "usable_cores", lambda: 2)
    reported: list[str] = []
    prepare(inputs, choice, tmp_path / "out", SETTINGS, report=reported.append)
    assert reported[1] == (
        "parsing with 1 parse process, one per file (continuing a stopped prepare that parsed "
        "one process per file; 3 files on 2 usable cores)"
    )
    digests = {p.name: file_sha256(p) for p in sorted((tmp_path / "out").iterdir())}
    assert digests == {p.name: file_sha256(p) for p in sorted(whole.iterdir())}
