"""The MovieLens reader: the three layouts, the vocabulary, labels, genres, bad rows."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from sample_files import RATINGS, data_config, movielens_spec, write_lines, write_ml1m, write_ml100k, write_ml_latest

from runtime.config.heads import HeadConfig
from runtime.data.checks.bad_rows import BadRowError, BadRowLog
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches
from runtime.data.movielens.reader import movielens_layout
from runtime.data.movielens.vocab import read_vocabulary
from runtime.data.sources import DataChoice, open_reader

USERS = sorted({r[0] for r in RATINGS})
MOVIES = sorted({r[1] for r in RATINGS})
WRITERS = {"ml-100k": write_ml100k, "ml-1m": write_ml1m, "ml-latest": write_ml_latest}


def _read(spec, path, **options):
    reader = open_reader(spec, DataChoice("movielens", str(path)), **options)
    log = BadRowLog(options.pop("policy", "fail"))
    locals_ = epoch_batches(reader, global_batch=100, rank=0, world_size=1, bad_rows=log, num_workers=0)
    return reader, [b.batch for b in locals_]


@pytest.mark.parametrize("layout", sorted(WRITERS))
def test_every_layout_maps_ids_through_a_sorted_vocabulary(tmp_path: Path, layout: str) -> None:
    WRITERS[layout](tmp_path)
    _, (batch,) = _read(movielens_spec(), tmp_path)  # the directory: the ratings file is found
    assert batch.sparse["user_id"].values().tolist() == [USERS.index(r[0]) + 1 for r in RATINGS]
    assert batch.sparse["movie_id"].values().tolist() == [MOVIES.index(r[1]) + 1 for r in RATINGS]
    stars = [r[2] - 0.5 if layout == "ml-latest" and r[0] % 2 else r[2] for r in RATINGS]
    assert batch.labels["like"].tolist() == [float(s >= 4.0) for s in stars]


def test_mse_heads_get_the_raw_rating_and_bce_a_chosen_threshold(tmp_path: Path) -> None:
    path = write_ml_latest(tmp_path)
    _, (raw,) = _read(movielens_spec(loss="mse"), path)
    assert raw.labels["like"].tolist() == [r[2] - 0.5 if r[0] % 2 else float(r[2]) for r in RATINGS]
    _, (liked,) = _read(movielens_spec(), path, threshold=3.0)
    assert liked.labels["like"].tolist() == [float(v >= 3.0) for v in raw.labels["like"].tolist()]


@pytest.mark.parametrize("layout", sorted(WRITERS))
def test_genres_are_a_multi_hot_bag_from_the_movies_file(tmp_path: Path, layout: str) -> None:
    WRITERS[layout](tmp_path)
    reader, (batch,) = _read(movielens_spec(genres=True), tmp_path)
    genres = batch.sparse["genres"]
    names = reader.vocabulary.genres
    bags = [[names[i] for i in bag.tolist()] for bag in genres.to_dense()]
    first, third = RATINGS[0][1], RATINGS[2][1]  # 242 (even), 377 (odd)
    if layout == "ml-1m":
        assert names == ("Action", "Comedy", "Drama")
        assert bags[0] == ["Action"] and bags[2] == ["Comedy", "Drama"]
    elif layout == "ml-latest":  # "(no genres listed)" is an empty bag
        assert bags == [["Adventure", "Children"] if r[1] % 3 else [] for r in RATINGS]
    else:
        expected = sorted({1 + first % 18, 1 + (first // 7) % 18})
        assert genres.to_dense()[0].tolist() == expected and len(names) == 19
        assert len(bags[2]) == len({1 + third % 18, 1 + (third // 7) % 18})
    assert genres.weights().eq(1.0).all()


def test_the_saved_vocabulary_keeps_trainings_genre_rows_whatever_movies_file_the_scored_data_has(
    tmp_path: Path,
) -> None:
    path = write_ml1m(tmp_path / "train")
    saved = tmp_path / "model.vocab.json"
    trained, (training,) = _read(movielens_spec(genres=True), path, vocab_path=saved, save_vocab=True)
    document = json.loads(saved.read_text())
    assert document["genres"] == ["Action", "Comedy", "Drama"]
    assert document["movieGenres"][str(RATINGS[2][1])] == [1, 2]  # an odd movie: Comedy|Drama
    # a request file beside a movies file without "Action" and with a new genre first in sorted order
    requests = write_lines(tmp_path / "requests" / "ratings.dat", ["::".join(map(str, r)) for r in RATINGS])
    write_lines(tmp_path / "requests" / "movies.dat", [f"{m}::Film {m} (1996)::Animation|Drama" for m in MOVIES])
    known = read_vocabulary(saved)
    assert known.genres == trained.vocabulary.genres and known.movie_genres == trained.vocabulary.movie_genres
    _, (scored,) = _read(movielens_spec(genres=True), requests, vocabulary=known)
    assert [bag.tolist() for bag in scored.sparse["genres"].to_dense()] == [
        bag.tolist() for bag in training.sparse["genres"].to_dense()
    ]
    del document["genres"], document["movieGenres"]  # saved before genres were kept: the training file's again
    saved.write_text(json.dumps(document))
    rebuilt = open_reader(
        movielens_spec(genres=True), DataChoice("movielens", str(path)), vocab_path=saved, save_vocab=True
    )
    assert rebuilt.vocabulary.genres == ("Action", "Comedy", "Drama") and "genres" in json.loads(saved.read_text())


def test_the_vocabulary_is_saved_reused_and_sends_unseen_ids_to_row_0(tmp_path: Path) -> None:
    path = write_ml1m(tmp_path / "ml-1m", crlf=True)
    saved = tmp_path / "model.vocab.json"
    reader, _ = _read(movielens_spec(), path, vocab_path=saved, save_vocab=True)
    document = json.loads(saved.read_text())
    assert document["userId"] == USERS and document["movieId"] == MOVIES
    again = open_reader(movielens_spec(), DataChoice("movielens", str(path)), vocab_path=saved)
    assert again.vocabulary.users == reader.vocabulary.users
    eval_path = write_lines(tmp_path / "eval" / "ratings.dat", ["196::242::5::1", "9999::242::1::2"])
    _, (batch,) = _read(movielens_spec(), eval_path, vocabulary=reader.vocabulary)
    assert batch.sparse["user_id"].values().tolist() == [USERS.index(196) + 1, 0]


def test_a_table_too_small_for_the_vocabulary_is_an_error(tmp_path: Path) -> None:
    path = write_ml100k(tmp_path)
    message = r"feature 'user_id': 11 rows needed \(userId values plus row 0 for unseen ids\) but its table has 5"
    with pytest.raises(DataError, match=message):
        open_reader(movielens_spec(users=5), DataChoice("movielens", str(path)))


@pytest.mark.parametrize(
    ("line", "column", "reason"),
    [
        ("1::2::3", None, "3 '::'-separated fields, expected 4 (userId, movieId, rating, timestamp)"),
        ("1::x::3::4", "movieId", "not a non-negative integer"),
        ("1::2::six::4", "rating", "not a number"),
        ("1::2::9::4", "rating", "outside the MovieLens range (0, 5]"),
        ("1::2::::4", "rating", "not a number"),
    ],
)
def test_bad_lines_name_their_column(tmp_path: Path, line: str, column: str | None, reason: str) -> None:
    path = write_lines(tmp_path / "ratings.dat", ["1::2::3::4", line])
    with pytest.raises(BadRowError) as caught:
        _read(movielens_spec(), path)
    assert (caught.value.row.line, caught.value.row.column, caught.value.row.reason) == (2, column, reason)


def test_the_csv_header_is_not_a_row_and_line_numbers_count_it(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ratings.csv", ["userId,movieId,rating,timestamp", "1,2,3.5,4", "1,2,x,4"])
    with pytest.raises(BadRowError, match=r"ratings.csv:3: column rating: not a number \(value 'x'\)"):
        _read(movielens_spec(), path)


def test_columns_map_other_feature_names_and_softmax_heads_are_refused() -> None:
    spec = movielens_spec()
    spec = dataclasses.replace(spec, sparse=(spec.sparse[0], dataclasses.replace(spec.sparse[1], name="item")))
    columns = dataclasses.replace(
        spec, data=data_config({"reader": "movielens", "path": "x", "columns": {"movieId": "item"}})
    )
    assert movielens_layout(columns).movie == "item"
    with pytest.raises(DataError, match=r"sparse features item have no movielens column"):
        movielens_layout(spec)
    with pytest.raises(DataError, match="movielens ratings feed bce heads"):
        movielens_layout(movielens_spec(loss="softmax"))


def _retrieval_spec(**head: str):
    inputs = movielens_spec()
    match = HeadConfig(**{"name": "match", "label": "movie_id", "loss": "sampled_softmax", **head})
    return dataclasses.replace(inputs, heads=(match,))


def test_a_retrieval_head_reads_positives_only_and_no_label(tmp_path: Path) -> None:
    path = write_ml1m(tmp_path)
    reader, (batch,) = _read(_retrieval_spec(), path)
    liked = [r for r in RATINGS if r[2] >= 4]  # (298, 474, 4) and (253, 465, 5)
    assert batch.sparse["user_id"].values().tolist() == [USERS.index(r[0]) + 1 for r in liked]
    assert batch.sparse["movie_id"].values().tolist() == [MOVIES.index(r[1]) + 1 for r in liked]
    assert batch.labels == {}
    # the vocabulary still holds every id of the file: the tables' rows do not depend on the threshold
    assert sorted(reader.vocabulary.movies) == MOVIES
    _, (lower,) = _read(_retrieval_spec(), path, threshold=3.0)
    assert lower.sparse["movie_id"].values().tolist() == [MOVIES.index(r[1]) + 1 for r in RATINGS if r[2] >= 3]


def test_positives_only_lines_keep_their_numbers_and_bad_lines_are_still_reported(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ratings.dat", ["1::10::2::5", "1::11::5::6", "1::x::5::7"])
    reader = open_reader(_retrieval_spec(), DataChoice("movielens", str(path)))
    assert [number for _, number, _ in reader.epoch_lines()] == [2, 3]
    with pytest.raises(BadRowError, match=r"ratings.dat:3: column movieId"):
        _read(_retrieval_spec(), path)


def test_retrieval_heads_are_refused_beside_label_heads_and_need_a_movie_feature() -> None:
    label_head = HeadConfig(name="like", label="like", loss="bce")
    both = dataclasses.replace(_retrieval_spec(), heads=(*_retrieval_spec().heads, label_head))
    with pytest.raises(DataError) as error:
        movielens_layout(both)
    assert str(error.value) == (
        "heads like need labels, but a sampled_softmax head makes movielens data positives only "
        "(ratings >= the threshold): train them in another spec"
    )
    with pytest.raises(DataError) as error:
        movielens_layout(_retrieval_spec(label="user_id"))
    assert str(error.value) == (
        "head 'match': its positives are the ids of feature 'user_id', which no movielens movie column feeds "
        "(movieId feeds 'movie_id', history feeds None)"
    )
    rated = dataclasses.replace(
        _retrieval_spec(), data=data_config({"reader": "movielens", "path": "x", "columns": {"rating": "like"}})
    )
    with pytest.raises(DataError) as error:
        movielens_layout(rated)
    assert str(error.value).startswith("data.columns.rating: a sampled_softmax head reads no label")


def test_a_comma_separated_ratings_file_without_its_header_is_refused_not_read_from_line_2(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "ratings.csv", ["1,10,5.0,100", "1,11,4.0,90"])
    message = (
        f"{path}:1: a comma-separated ratings file (ml-latest's ratings.csv) starts with the header "
        "userId,movieId,..., not '1,10,5.0,100'"
    )
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        open_reader(movielens_spec(), DataChoice("movielens", str(path)))
    path.write_bytes(b"\xef\xbb\xbfuserId,movieId,rating,timestamp\n1,10,5.0,100\n")  # a BOM is fine
    _, (batch,) = _read(movielens_spec(), path)
    assert batch.labels["like"].tolist() == [1.0]


def test_a_movie_with_more_genres_than_max_ids_per_sample_is_a_bad_row(tmp_path: Path) -> None:
    path = write_ml1m(tmp_path)
    inputs = movielens_spec(genres=True)
    inputs = dataclasses.replace(
        inputs,
        sparse=tuple(dataclasses.replace(f, ids_per_sample=1) if f.name == "genres" else f for f in inputs.sparse),
    )
    reader = open_reader(inputs, DataChoice("movielens", str(path)))
    log = BadRowLog("skip")
    (local,) = epoch_batches(reader, global_batch=100, rank=0, world_size=1, bad_rows=log, num_workers=0)
    two = [i + 1 for i, r in enumerate(RATINGS) if len(reader.vocabulary.movie_genres.get(r[1], ())) > 1]
    assert two and local.batch.batch_size == len(RATINGS) - len(two)
    assert str(log.examples[0]) == (
        f"{path}:{two[0]}: column genres: movie {RATINGS[two[0] - 1][1]} has 2 genres, but feature 'genres' takes "
        "at most 1 (max_ids_per_sample) (value 'Comedy|Drama')"
    )
