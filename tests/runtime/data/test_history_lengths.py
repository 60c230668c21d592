"""runtime/data/checks/history_lengths.py: sequence lengths in training and evaluation rows compared, and said."""

from __future__ import annotations

from pathlib import Path

from sample_files import spec, write_lines

from runtime.data.checks.history_lengths import length_warnings, prepared_lengths, reader_lengths, sequence_features
from runtime.data.sources import DataChoice, open_reader


def history_spec():
    return spec(
        [],
        [{"name": "movie_id", "table": "movie"}, {"name": "history", "table": "movie", "max_length": 50}],
        {"movie": 40},
        [{"name": "like", "label": "like", "loss": "bce"}],
    )


def test_more_than_twice_apart_is_said_with_the_feature_and_both_means() -> None:
    assert length_warnings({"history": 4.0, "tags": 3.0}, {"history": 8.0, "tags": 6.1}, "csv:a", "csv:b") == [
        "sequence feature 'tags': its mean length is 6.1 in the evaluation rows (csv:b) but 3.0 in the training "
        "rows (csv:a), more than 2x apart: the model is measured on histories unlike the ones it trained on"
    ]  # 8.0 is exactly twice 4.0: not more
    assert length_warnings({"history": 0.0}, {"history": 0.5}, "a", "b")[0].startswith(
        "sequence feature 'history': its mean length is 0.5 in the evaluation rows (b) but 0.0 in the training"
    )
    assert length_warnings({"history": 0.0}, {"history": 0.0}, "a", "b") == []


def test_a_split_whose_evaluation_rows_carry_the_training_past_is_measured(tmp_path: Path) -> None:
    inputs = history_spec()
    assert sequence_features(inputs) == ("history",)
    # users 1..3 rate movies 1..6 in training: histories of 0..5 movies, 2.5 on average
    train = write_lines(
        tmp_path / "train" / "ratings.dat", [f"{u}::{m}::5::{m}" for u in (1, 2, 3) for m in range(1, 7)]
    )
    test = write_lines(tmp_path / "test" / "ratings.dat", [f"{u}::7::5::100" for u in (1, 2, 3)])
    reader = open_reader(inputs, DataChoice("movielens", str(train)))
    evaluated = open_reader(inputs, DataChoice("movielens", str(test)), vocabulary=reader.vocabulary, training=reader)
    trained, held = reader_lengths(reader, ("history",)), reader_lengths(evaluated, ("history",))
    assert (trained, held) == ({"history": 2.5}, {"history": 6.0})
    assert reader_lengths(reader, ("history",), rows=6) == {"history": 2.5}  # the first user's six rows
    assert length_warnings(trained, held, "movielens:train", "movielens:test") == [
        "sequence feature 'history': its mean length is 6.0 in the evaluation rows (movielens:test) but 2.5 in the "
        "training rows (movielens:train), more than 2x apart: the model is measured on histories unlike the ones "
        "it trained on"
    ]


def test_a_next_item_heads_own_sequence_is_not_compared() -> None:
    inputs = spec(
        [],
        [{"name": "history", "table": "movie", "max_length": 50}],
        {"movie": 40},
        [{"name": "next", "label": "history", "loss": "sampled_softmax"}],
    )
    assert sequence_features(inputs) == ()
    assert sequence_features(history_spec()) == ("history",)


def test_prepared_data_gives_the_mean_of_every_row_from_its_statistics() -> None:
    columns = {"sparse.history": {"stats": {"rows": 8, "values": 20}}, "sparse.movie_id": {"stats": {"rows": 8}}}
    assert prepared_lengths(columns, ("history", "other")) == {"history": 2.5}
