"""The timestamps check: in the loader, in `reccompile check`'s sample, and on a hand-built batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sample_files import write_lines
from test_movielens_history import TRAIN, history_spec

from runtime.config.data import TimestampsConfig
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.checks.timestamps import check_timestamps
from runtime.data.columns import Columns, Jagged
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches
from runtime.data.sample_check import check_sample
from runtime.data.sources import DataChoice
from runtime.sparse.jagged import KeyedJaggedTensor

STAMPS = (TimestampsConfig("history_time", "history"),)


def _kjt(history: list[int], times: list[int]) -> KeyedJaggedTensor:
    lengths = torch.tensor(history + times)
    return KeyedJaggedTensor.from_lengths_sync(
        ["history", "history_time"], torch.arange(int(lengths.sum())), lengths, stride=len(history)
    )


def test_a_batch_whose_times_match_passes() -> None:
    check_timestamps(_kjt([2, 0, 3], [2, 0, 3]), STAMPS)


def test_the_first_sample_that_differs_is_named() -> None:
    with pytest.raises(DataError) as caught:
        check_timestamps(_kjt([2, 0, 3, 1], [2, 0, 2, 2]), STAMPS)
    assert str(caught.value) == (
        "timestamps feature 'history_time' at sample 2: 2 times but its sequence 'history' has 3 ids"
    )


def test_a_missing_key_is_named() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(["history"], torch.arange(3), torch.tensor([1, 2]))
    with pytest.raises(DataError) as caught:
        check_timestamps(kjt, STAMPS)
    assert str(caught.value) == "timestamps feature 'history_time': the batch has no key 'history_time'"


class _MisalignedReader:
    """A reader whose second row's history has 2 ids but 1 time."""

    name, source, weighted, unseen_features, timestamps = "fake", "fake.txt", False, (), STAMPS

    def epoch_lines(self):
        return [("fake.txt", n, b"row") for n in (1, 2, 3)]

    def parse(self, line: bytes) -> bytes:
        return line

    def to_columns(self, rows: list[bytes]) -> Columns:
        history = Jagged(torch.tensor([1, 2, 0]), torch.tensor([5, 6, 7]), None)
        times = Jagged(torch.tensor([1, 1, 0]), torch.tensor([10, 20]), None)
        return Columns({}, {"history": history, "history_time": times}, {"like": torch.zeros(3)})


def test_the_loader_checks_every_batch() -> None:
    batches = epoch_batches(
        _MisalignedReader(), global_batch=3, rank=0, world_size=1, bad_rows=BadRowLog(), num_workers=0
    )
    with pytest.raises(DataError) as caught:
        next(batches)
    assert str(caught.value) == (
        "timestamps feature 'history_time' at sample 1: 1 times but its sequence 'history' has 2 ids"
    )


def test_reccompile_check_describes_histories_and_their_times(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ratings.dat", TRAIN)
    report = check_sample(history_spec(), DataChoice("movielens", str(path)))
    assert report.errors == [f"{path}:5: error: column rating: not a number (value 'x')"]
    assert "  feature history: 4 distinct rows of 20 (max row 4), 1.4 ids per row" in report.notes
    assert "  timestamps history_time: 50 to 300, 1.4 per row" in report.notes
