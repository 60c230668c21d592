"""A next-item model's evaluation ranks each held-out rating's own movie, not a movie of its history."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from sample_files import spec, write_lines
from torch import nn

from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.columns import USER_IDS
from runtime.data.loader import epoch_batches
from runtime.data.sources import DataChoice, open_reader
from runtime.retrieval.head import next_item_output
from runtime.train.evaluate import evaluate

# Users 1 and 2 rate movies 10..14 in training; the held-out movies (13 for user 1, 14 for user 2)
# are in neither user's history. Movie rows of the sorted vocabulary: 10 -> 1, ..., 14 -> 5.
TRAIN = ["1::10::5::100", "1::11::4::200", "2::12::5::100", "2::11::4::150", "1::14::4::50", "2::13::5::10"]
TEST = ["1::13::5::300", "2::14::4::300"]
ROWS = 6


def next_item_spec(max_length: int = 5, mask_seen: bool = True):
    head = {"name": "next", "label": "history", "loss": "sampled_softmax", "metrics": ("recall@1", "recall@2", "mrr")}
    return spec(
        [],
        [{"name": "history", "table": "movie", "max_length": max_length}],
        {"movie": ROWS},
        [{**head, "mask_seen": mask_seen}],
    )


class ScoreTable(nn.Module):
    """A next-item model whose query at a position scoring item j is SCORES[the position's item, j];
    its items are one-hot rows, so the model's scores are exactly the table's."""

    def __init__(self, scores: torch.Tensor) -> None:
        super().__init__()
        self.scores = scores

    def item_catalogue(self) -> torch.Tensor:
        return torch.eye(ROWS)

    def forward(self, dense: dict, sparse) -> dict:
        jagged = sparse["history"]
        width = int(jagged.lengths().max())
        ids = torch.full((jagged.lengths().numel(), width), 0, dtype=torch.long)
        mask = torch.arange(width).unsqueeze(0) < jagged.lengths().unsqueeze(1)
        ids[mask] = jagged.values()
        return {"next": next_item_output(self.scores[ids], torch.eye(ROWS)[ids], jagged)}


def _read(inputs, path: Path, **options):
    reader = open_reader(inputs, DataChoice("movielens", str(path)), **options)
    batches = epoch_batches(reader, global_batch=8, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=0)
    return reader, list(batches)


@pytest.mark.parametrize(
    ("mask_seen", "expected"),
    [
        # user 1's row 4 (0.5) under rows 1, 2, 3 and 5: position 4; user 2's row 5 (0.9): position 0
        (False, {"recall@1": 0.5, "recall@2": 0.5, "mrr": (1 / 5 + 1) / 2}),
        # user 1's history (rows 5, 1, 2) is no candidate: only row 3 (0.8) above it, position 1
        (True, {"recall@1": 0.5, "recall@2": 1.0, "mrr": (1 / 2 + 1) / 2}),
    ],
)
def test_evaluation_ranks_the_held_out_movie_from_the_whole_history(
    tmp_path: Path, mask_seen: bool, expected: dict[str, float]
) -> None:
    inputs = next_item_spec(mask_seen=mask_seen)
    train, (trained,) = _read(inputs, write_lines(tmp_path / "train" / "ratings.dat", TRAIN))
    _, (held,) = _read(
        inputs,
        write_lines(tmp_path / "test" / "ratings.dat", TEST),
        vocabulary=train.vocabulary,
        training=train,
        held_out=True,
    )
    history = held.batch.sparse["history"]
    # user 1: 14 (t=50), 10, 11, then the held-out 13; user 2: 13 (t=10), 12, 11, then 14
    assert torch.split(history.values(), history.lengths().tolist())[0].tolist() == [5, 1, 2, 4]
    assert torch.split(history.values(), history.lengths().tolist())[1].tolist() == [4, 3, 2, 5]
    # Both histories end with movie 11 (row 2): its query's scores over rows 0..5 rank the held-out
    # rows 4 (user 1) and 5 (user 2). (Ranking the history's last movie from the query before it,
    # as evaluation did, would rank on an all-zero row of scores.)
    scores = torch.zeros(ROWS, ROWS)
    scores[2] = torch.tensor([0.0, 0.7, 0.6, 0.8, 0.5, 0.9])
    metrics = evaluate(ScoreTable(scores), [held], inputs.heads)["next"]
    assert metrics == pytest.approx(expected, abs=1e-12)
    assert len(trained.batch.sparse["history"].values()) == 6  # training rows: their histories only


def test_requests_and_training_rows_keep_their_history_alone(tmp_path: Path) -> None:
    inputs = next_item_spec(max_length=2)
    train, _ = _read(inputs, write_lines(tmp_path / "train" / "ratings.dat", TRAIN))
    test = write_lines(tmp_path / "test" / "ratings.dat", TEST)
    _, (requests,) = _read(inputs, test, vocabulary=train.vocabulary, training=train)
    _, (held,) = _read(inputs, test, vocabulary=train.vocabulary, training=train, held_out=True)
    assert requests.batch.sparse["history"].values().tolist() == [1, 2, 3, 2]  # the latest two
    assert held.batch.sparse["history"].values().tolist() == [2, 4, 2, 5]  # the latest one, then its own


def test_per_user_metrics_take_the_user_ids_the_reader_puts_in_the_labels(tmp_path: Path) -> None:
    inputs = next_item_spec()
    head = dataclasses.replace(inputs.heads[0], metrics=("mrr", "user_mrr"))
    inputs = dataclasses.replace(inputs, heads=(head,))
    train, _ = _read(inputs, write_lines(tmp_path / "train" / "ratings.dat", TRAIN))
    # user 1 holds out two ratings, user 2 one: the per-user mean weighs the users alike
    test = write_lines(tmp_path / "test" / "ratings.dat", [*TEST, "1::12::4::400"])
    _, (held,) = _read(inputs, test, vocabulary=train.vocabulary, training=train, held_out=True)
    assert held.batch.labels[USER_IDS].tolist() == [1, 2, 1]
    scores = torch.zeros(ROWS, ROWS)
    scores[2] = torch.tensor([0.0, 0.7, 0.6, 0.8, 0.5, 0.9])  # user 1's first row: position 1, user 2's: 0
    scores[4] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # user 1's second (after movie 13): row 3 ties, position 1
    metrics = evaluate(ScoreTable(scores), [held], inputs.heads)["next"]
    assert metrics == pytest.approx({"mrr": (1 / 2 + 1 + 1 / 2) / 3, "user_mrr": ((1 / 2 + 1 / 2) / 2 + 1) / 2})
