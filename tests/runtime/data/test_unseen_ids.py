"""Ids outside the vocabulary: counted per feature over the batches taken, the same on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from sample_files import RATINGS, criteo_lines, criteo_spec, movielens_spec, write_lines, write_ml100k

from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.checks.unseen_ids import UnseenIds, unseen_counter
from runtime.data.criteo.reader import CriteoReader
from runtime.data.loader import epoch_batches, training_batches
from runtime.data.movielens.vocab import Vocabulary, build_vocabulary
from runtime.data.sources import DataChoice, open_reader

# The vocabulary of another file: the users of the first 6 ratings, the movies of the first 8.
OTHER = Vocabulary(
    build_vocabulary((u, 0) for u, _, _, _ in RATINGS[:6]).users,
    build_vocabulary((0, m) for _, m, _, _ in RATINGS[:8]).movies,
)


def _reader(tmp_path: Path):
    path = write_ml100k(tmp_path / "ml-100k")
    return open_reader(movielens_spec(), DataChoice("movielens", str(path)), vocabulary=OTHER)


def _expected(rows: list[tuple[int, int, int, int]]) -> dict[str, int]:
    """The reference: rows whose id the vocabulary lacks, per feature."""
    return {
        "user_id": sum(u not in OTHER.users for u, _, _, _ in rows),
        "movie_id": sum(m not in OTHER.movies for _, m, _, _ in rows),
    }


@pytest.mark.parametrize("taken", [2, 3])
def test_training_counts_the_global_batches_taken_on_every_rank(tmp_path: Path, taken: int) -> None:
    reader = _reader(tmp_path)
    found = []
    for rank in (0, 1):
        unseen = unseen_counter(reader)
        batches = training_batches(
            reader, global_batch=4, rank=rank, world_size=2, bad_rows=BadRowLog(), num_workers=0, unseen=unseen
        )
        for _ in range(taken):
            next(batches)
        found.append((unseen.counts, unseen.rows))
    # 3 batches of 4 reach rows 9, 10 and, in the second epoch, rows 1, 2
    rows = (RATINGS * 2)[: 4 * taken]
    assert found == [(_expected(rows), 4 * taken)] * 2
    assert found[0][0] == ({"user_id": 2, "movie_id": 0} if taken == 2 else {"user_id": 4, "movie_id": 2})


@pytest.mark.parametrize("world_size", [1, 4])
def test_an_evaluation_pass_counts_real_rows_not_padding(tmp_path: Path, world_size: int) -> None:
    reader = _reader(tmp_path)
    for rank in range(world_size):
        unseen = unseen_counter(reader)
        shares = epoch_batches(
            reader,
            global_batch=4,
            rank=rank,
            world_size=world_size,
            bad_rows=BadRowLog(),
            num_workers=0,
            unseen=unseen,
        )
        assert len(list(shares)) == 3  # the last batch: rows 9 and 10, padded on ranks 2 and 3
        assert unseen.counts == _expected(RATINGS) == {"user_id": 4, "movie_id": 2}
        assert unseen.describe() == "ids not in the training vocabulary (row 0): user_id 4, movie_id 2 of 10 rows"


def test_ids_of_the_vocabularys_own_file_are_all_seen(tmp_path: Path) -> None:
    path = write_ml100k(tmp_path / "ml-100k")
    reader = open_reader(movielens_spec(), DataChoice("movielens", str(path)))
    unseen = unseen_counter(reader)
    shares = epoch_batches(
        reader, global_batch=3, rank=0, world_size=1, bad_rows=BadRowLog(), num_workers=0, unseen=unseen
    )
    assert len(list(shares)) == 4
    assert (unseen.counts, unseen.rows) == ({"user_id": 0, "movie_id": 0}, 10)


def test_criteo_ids_are_hashed_and_never_unseen(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day_0", criteo_lines(3))
    assert unseen_counter(CriteoReader(criteo_spec(), path)) is None


def test_the_description_lists_every_feature_in_order() -> None:
    unseen = UnseenIds(("movie_id", "user_id"))
    assert unseen.describe() == "ids not in the training vocabulary (row 0): movie_id 0, user_id 0 of 0 rows"
