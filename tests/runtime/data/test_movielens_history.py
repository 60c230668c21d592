"""MovieLens histories: each rating's earlier movies and times, cut, split-safe, sliced per rank."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from sample_files import criteo_spec, spec, write_lines

from runtime.config.data import TimestampsConfig
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches
from runtime.data.movielens.reader import movielens_layout
from runtime.data.sources import DataChoice, open_reader

# ratings.dat lines in file order (user, movie, rating, timestamp); users' times out of order,
# two ties (user 1 at 200, user 2 at 50) and a bad line that belongs to no history.
TRAIN = [
    "1::10::5::300",
    "1::11::3::100",
    "2::10::4::50",
    "1::12::4::200",
    "1::15::x::150",
    "1::13::2::200",
    "1::14::1::400",
    "2::11::5::50",
    "2::12::3::60",
]
# Movie rows of the sorted vocabulary (15 is only on the bad line): 10 -> 1, 11 -> 2, ... 14 -> 5.
HISTORIES = [  # per good line: (movie rows, timestamps), oldest first
    ([2, 3, 4], [100, 200, 200]),  # the tie at 200 in line order: movie 12 (line 4) before 13 (line 6)
    ([], []),
    ([], []),
    ([2], [100]),  # strictly earlier: not movie 13, rated in the same second
    ([2], [100]),
    ([2, 3, 4, 1], [100, 200, 200, 300]),
    ([], []),  # user 2's two ratings at 50 are not each other's history
    ([1, 2], [50, 50]),
]


def history_spec(max_length: int = 10, keep: str = "end", timestamps: bool = True, **history: object):
    inputs = spec(
        [],
        [
            {"name": "user_id", "table": "user_id"},
            {"name": "movie_id", "table": "movie"},
            {"name": "history", "table": "movie", "max_length": max_length, "keep": keep, **history},
        ],
        {"user_id": 10, "movie": 20},
        [{"name": "like", "label": "like", "loss": "bce"}],
    )
    stamps = (TimestampsConfig("history_time", "history"),) if timestamps else ()
    return dataclasses.replace(inputs, timestamps=stamps)


def _batches(inputs, path: Path, world_size: int = 1, rank: int = 0, global_batch: int = 100, **options):
    reader = open_reader(inputs, DataChoice("movielens", str(path)), **options)
    log = BadRowLog("skip")
    shares = epoch_batches(
        reader, global_batch=global_batch, rank=rank, world_size=world_size, bad_rows=log, num_workers=0
    )
    return reader, [share.batch for share in shares], log


def _bags(batch, key: str) -> list[list[int]]:
    jt = batch.sparse[key]
    return [row.tolist() for row in torch.split(jt.values(), jt.lengths().tolist())]


def test_each_rating_gets_the_users_strictly_earlier_movies_and_times(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ratings.dat", TRAIN)
    _, (batch,), log = _batches(history_spec(), path)
    assert log.bad == 1
    assert batch.sparse.keys() == ["user_id", "movie_id", "history", "history_time"]
    assert _bags(batch, "history") == [movies for movies, _ in HISTORIES]
    assert _bags(batch, "history_time") == [times for _, times in HISTORIES]
    assert batch.sparse["history_time"].values().dtype == torch.int64


@pytest.mark.parametrize(
    ("keep", "movies", "times"),
    [
        (
            "end",
            [[3, 4], [], [], [2], [2], [4, 1], [], [1, 2]],
            [[200, 200], [], [], [100], [100], [200, 300], [], [50, 50]],
        ),
        (
            "start",
            [[2, 3], [], [], [2], [2], [2, 3], [], [1, 2]],
            [[100, 200], [], [], [100], [100], [100, 200], [], [50, 50]],
        ),
    ],
)
def test_the_reader_builds_no_more_than_max_length_on_the_keep_side(
    tmp_path: Path, keep: str, movies: list[list[int]], times: list[list[int]]
) -> None:
    path = write_lines(tmp_path / "ratings.dat", TRAIN)
    _, (batch,), _ = _batches(history_spec(max_length=2, keep=keep), path)
    assert _bags(batch, "history") == movies
    assert _bags(batch, "history_time") == times


def test_evaluation_histories_take_the_training_past_and_never_the_future(tmp_path: Path) -> None:
    train = write_lines(tmp_path / "train" / "ratings.dat", TRAIN)
    test_lines = ["1::16::4::250", "2::10::3::55", "3::11::4::10", "1::14::5::500"]
    test = write_lines(tmp_path / "test" / "ratings.dat", test_lines)
    reader, (trained,), _ = _batches(history_spec(), train)
    _, (evaluated,), _ = _batches(history_spec(), test, vocabulary=reader.vocabulary, training=reader)
    assert _bags(evaluated, "history") == [
        [2, 3, 4],  # user 1 before 250: not movie 10, rated at 300 in training
        [1, 2],
        [],  # a user training never saw
        [2, 3, 4, 0, 1, 5],  # movie 16 (row 0: not in the training vocabulary) from the test file itself
    ]
    assert _bags(evaluated, "history_time")[3] == [100, 200, 200, 250, 300, 400]
    assert _bags(trained, "history") == [movies for movies, _ in HISTORIES]  # no test rating in training
    _, (alone,), _ = _batches(history_spec(), test, vocabulary=reader.vocabulary)
    assert _bags(alone, "history") == [[], [], [], [0]]  # without the training reader: the test file only


def test_rank_slices_carry_histories_and_times(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ratings.dat", TRAIN)
    _, whole, _ = _batches(history_spec(), path, global_batch=4)
    parts = [_batches(history_spec(), path, world_size=2, rank=r, global_batch=4)[1] for r in range(2)]
    for key in ("user_id", "history", "history_time"):
        expected = [bag for batch in whole for bag in _bags(batch, key)]
        sliced = [bag for step in zip(*parts) for batch in step for bag in _bags(batch, key)]
        assert sliced == expected
    assert [b.batch_size for b in parts[0]] == [2, 2]


def test_weighted_specs_give_timestamps_weight_one(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ratings.dat", TRAIN)
    inputs = history_spec()
    weighted_user = dataclasses.replace(inputs.sparse[0], weighted=True)
    inputs = dataclasses.replace(inputs, sparse=(weighted_user, *inputs.sparse[1:]))
    _, (batch,), _ = _batches(inputs, path)
    assert batch.sparse["history_time"].weights().eq(1.0).all()


def test_mapping_errors_name_the_feature(tmp_path: Path) -> None:
    pooled = history_spec(timestamps=False)
    pooled_history = dataclasses.replace(pooled.sparse[2], max_length=None)
    pooled = dataclasses.replace(pooled, sparse=(*pooled.sparse[:2], pooled_history))
    with pytest.raises(DataError) as caught:
        movielens_layout(pooled)
    assert str(caught.value) == (
        "feature 'history': the history column feeds a sequence feature (pooling: none with a max_length), "
        "but 'history' is pooled"
    )
    other = dataclasses.replace(history_spec(), timestamps=(TimestampsConfig("other_time", "movie_id"),))
    with pytest.raises(DataError) as caught:
        movielens_layout(other)
    assert str(caught.value) == (
        "timestamps feature 'other_time' belongs to sequence 'movie_id', which the history column does not "
        "feed: movielens has timestamps for the history only"
    )
    inputs = history_spec()
    small = dataclasses.replace(
        inputs, sparse=(*inputs.sparse[:2], dataclasses.replace(inputs.sparse[2], num_embeddings=3))
    )
    path = write_lines(tmp_path / "ratings.dat", TRAIN)
    with pytest.raises(DataError) as caught:
        open_reader(small, DataChoice("movielens", str(path)))
    assert str(caught.value) == (
        "feature 'history': 6 rows needed (movieId values plus row 0 for unseen ids) but its table has 3"
    )


def test_criteo_refuses_timestamps_features() -> None:
    inputs = dataclasses.replace(criteo_spec(2), timestamps=(TimestampsConfig("t", "cat_0"),))
    with pytest.raises(DataError) as caught:
        open_reader(inputs, DataChoice("criteo", "unused"))
    assert str(caught.value) == "criteo has no timestamps to feed timestamps features t"
