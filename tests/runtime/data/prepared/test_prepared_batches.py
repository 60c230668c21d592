"""runtime/data/prepared/{order,reading,batches}.py: ranks read their rows only, exactly, resumably."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sample_files import criteo_lines, criteo_spec, write_lines
from test_movielens_history import TRAIN, history_spec

from runtime.data.batch import Batch
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches
from runtime.data.movielens.vocab import read_vocabulary
from runtime.data.prepared.batches import PreparedBatches, prepared_epoch_batches
from runtime.data.prepared.order import EpochOrder
from runtime.data.prepared.prepare import PrepareSettings, prepare
from runtime.data.prepared.reading import PreparedData, open_prepared
from runtime.data.sources import DataChoice, open_reader

ROWS = 400  # 25 row groups of 16


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    raw = write_lines(root / "day_0", criteo_lines(ROWS, seed=3))
    settings = PrepareSettings(row_group_rows=16, part_row_groups=4, workers=0)
    prepare(criteo_spec(rows=1000), DataChoice("criteo", str(raw)), root / "out", settings)
    return root / "out"


def _data(path: Path, seed: int | None = None, window: int = 0) -> PreparedData:
    return open_prepared(criteo_spec(rows=1000), path, seed=seed, window=window)


def _joined(parts: list[Batch]) -> tuple[torch.Tensor, ...]:
    """A global batch from its ranks' shares: dense, labels, and each row's ids (spec order)."""
    dense = torch.cat([p.dense["int"] for p in parts])
    labels = torch.cat([p.labels["click"] for p in parts])
    ids = torch.cat([p.sparse.values().view(26, -1) for p in parts], dim=1)  # one id per feature and row
    return dense, labels, ids


def _rows(order: EpochOrder, epoch: int, lo: int, hi: int) -> list[int]:
    """The prepared rows (global index) of positions lo..hi-1."""
    selection = order.select(epoch, lo, hi)
    starts = order.starts
    if selection.ranges is not None:
        return [int(starts[g]) + r for g, (a, b) in zip(selection.groups, selection.ranges) for r in range(a, b)]
    joined = np.concatenate([[0], np.cumsum([order.group_rows[g] for g in selection.groups])])
    slots = np.searchsorted(joined, selection.take, side="right") - 1
    return [int(starts[selection.groups[s]] + t - joined[s]) for s, t in zip(slots, selection.take)]


def test_a_shuffled_epoch_is_a_permutation_of_the_rows_and_another_each_epoch() -> None:
    order = EpochOrder([16] * 9 + [7], seed=11, window=3)
    epochs = [_rows(order, e, 0, 20) + _rows(order, e, 20, 151) for e in range(2)]
    assert sorted(epochs[0]) == list(range(151)) and sorted(epochs[1]) == list(range(151))
    assert epochs[0] != epochs[1]
    assert _rows(EpochOrder([16] * 9 + [7], seed=11, window=3), 1, 0, 151) == epochs[1]  # a function of (seed, epoch)
    assert _rows(EpochOrder([16] * 9 + [7], seed=None, window=0), 0, 0, 151) == list(range(151))


@pytest.mark.parametrize("seed, window", [(None, 0), (5, 3)])
def test_two_ranks_train_exactly_what_one_process_would(prepared: Path, seed: int | None, window: int) -> None:
    data = _data(prepared, seed, window)
    one = PreparedBatches(data, global_batch=48, rank=0, world_size=1, num_workers=0)
    two = [PreparedBatches(data, global_batch=48, rank=r, world_size=2, num_workers=2) for r in range(2)]
    for _ in range(20):  # 960 rows: over two epochs, batches straddling their ends
        single = _joined([next(one)])
        shares = _joined([next(rank) for rank in two])
        for a, b in zip(single, shares):
            assert torch.equal(a, b)
    for batches in (one, *two):
        batches.close()


def test_each_rank_decodes_its_share_of_the_row_groups(prepared: Path) -> None:
    data = _data(prepared)
    decoded = {}
    for world_size in (1, 2, 4):
        for rank in range(world_size):
            batches = PreparedBatches(data, global_batch=64, rank=rank, world_size=world_size, num_workers=0)
            for _ in range(6):  # 384 rows: within the first epoch
                next(batches)
            decoded[world_size, rank] = batches.decoded.rows
    assert decoded[1, 0] == 384
    assert [decoded[2, r] for r in range(2)] == [192, 192]
    assert [decoded[4, r] for r in range(4)] == [96] * 4


def test_where_decoding_does_not_fall_as_1_over_n(prepared: Path) -> None:
    """The two cases runtime.data.prepared.batches' docstring names: a row group shared by two
    ranks' slices is decoded by both, and a shuffle deals every rank rows of every group of a window."""

    def decoded(data: PreparedData, world_size: int) -> list[int]:
        rows = []
        for rank in range(world_size):
            batches = PreparedBatches(data, global_batch=64, rank=rank, world_size=world_size, num_workers=0)
            for _ in range(6):
                next(batches)
            rows.append(batches.decoded.rows)
        return rows

    assert decoded(_data(prepared), 8) == [96] * 8  # slices of 8 rows, row groups of 16: twice the share of 48
    assert decoded(_data(prepared, seed=1, window=4), 2) == [384, 384]  # windows of 64 rows: all their rows, not 192


def test_a_resumed_reader_starts_at_the_row_and_decodes_nothing_before_it(prepared: Path) -> None:
    data = _data(prepared)
    straight = PreparedBatches(data, global_batch=32, rank=1, world_size=2, num_workers=0)
    expected = [next(straight) for _ in range(12)]
    resumed = PreparedBatches(data, global_batch=32, rank=1, world_size=2, num_workers=1)
    state = straight.state_after(7)
    assert state == {"reader": "prepared", "row": 224, "seed": None, "window": 0}
    resumed.load_state_dict(state)
    for batch in expected[7:]:
        for a, b in zip(_joined([batch]), _joined([next(resumed)])):
            assert torch.equal(a, b)
    # rank 1's half of batch g is rows 32g + 16 .. 32g + 31: row group 2g + 1, from batch 7 on only
    assert resumed.decoded.groups == [15, 17, 19, 21, 23]
    resumed.close()


def test_each_new_pass_over_the_rows_is_told_with_the_step_that_ended_the_last(prepared: Path) -> None:
    told: list[tuple[int, int]] = []
    batches = PreparedBatches(
        _data(prepared),
        global_batch=96,
        rank=0,
        world_size=1,
        num_workers=0,
        on_wrap=lambda passes, step: told.append((passes, step)),
    )
    for _ in range(8):
        next(batches)
    assert told == [(2, 5)]  # row 399, the end of pass 1, is in step 5 (rows 384..479)
    next(batches)
    assert told == [(2, 5), (3, 9)]  # row 799 in step 9
    resumed = PreparedBatches(
        _data(prepared),
        global_batch=96,
        rank=0,
        world_size=1,
        num_workers=0,
        on_wrap=lambda passes, step: told.append((passes, step)),
    )
    resumed.load_state_dict(batches.state_after(5))
    told.clear()
    for _ in range(4):
        next(resumed)
    assert told == [(3, 9)]
    batches.close()
    resumed.close()


@pytest.mark.parametrize(
    ("seed", "window", "message"),
    [
        (5, 2, "with --shuffle-window 4, this run with 2: resume with --shuffle-window 4"),
        (None, 0, "with --shuffle-window 4, this run with 0: resume with --shuffle-window 4"),  # unshuffled
        (6, 4, "shuffled with --seed 5, this run with 6: resume with --seed 5"),
    ],
)
def test_a_position_of_another_shuffle_is_refused_naming_what_differs(
    prepared: Path, seed: int | None, window: int, message: str
) -> None:
    batches = PreparedBatches(_data(prepared, seed=seed, window=window), global_batch=32, rank=0, world_size=1)
    with pytest.raises(DataError) as error:
        batches.load_state_dict({"reader": "prepared", "row": 64, "seed": 5, "window": 4})
    assert str(error.value) == f"the checkpoint read prepared data {message} to continue its order"


def test_one_epoch_pads_the_last_batch_as_the_file_readers_do(prepared: Path) -> None:
    raw = prepared.parent / "day_0"
    inputs = criteo_spec(rows=1000)
    for rank in range(3):
        files = epoch_batches(
            open_reader(inputs, DataChoice("criteo", str(raw))),
            global_batch=96,
            rank=rank,
            world_size=3,
            bad_rows=BadRowLog(),
            num_workers=0,
        )
        ours = prepared_epoch_batches(_data(prepared), global_batch=96, rank=rank, world_size=3, num_workers=1)
        pairs = list(zip(files, ours, strict=True))
        assert len(pairs) == 5 and pairs[-1][0].real == pairs[-1][1].real  # 400 = 4 * 96 + 16
        for file_batch, prepared_batch in pairs:
            for a, b in zip(_joined([file_batch.batch]), _joined([prepared_batch.batch])):
                assert torch.equal(a, b)


def test_sequences_and_their_timestamps_are_list_columns(tmp_path: Path) -> None:
    ratings = write_lines(tmp_path / "ml" / "ratings.dat", TRAIN)
    inputs = history_spec(max_length=3)
    out = tmp_path / "out"
    prepare(inputs, DataChoice("movielens", str(ratings)), out, PrepareSettings(row_group_rows=4, workers=0))
    reader = open_reader(inputs, DataChoice("movielens", str(ratings)))
    (expected,) = epoch_batches(reader, global_batch=8, rank=0, world_size=1, bad_rows=BadRowLog("skip"), num_workers=0)
    (got,) = prepared_epoch_batches(open_prepared(inputs, out), global_batch=8, rank=0, world_size=1)
    assert got.batch.sparse.keys() == expected.batch.sparse.keys() == ["user_id", "movie_id", "history", "history_time"]
    for key in expected.batch.sparse.keys():
        assert got.batch.sparse[key].lengths().tolist() == expected.batch.sparse[key].lengths().tolist()
        assert got.batch.sparse[key].values().tolist() == expected.batch.sparse[key].values().tolist()
    assert (out / "vocab.json").is_file()


@pytest.mark.parametrize("workers", [0, 1])
def test_evaluation_data_prepared_with_the_training_ratings_is_what_the_eval_reader_reads(
    tmp_path: Path, workers: int
) -> None:
    train = write_lines(tmp_path / "train" / "ratings.dat", TRAIN)
    test = write_lines(tmp_path / "test" / "ratings.dat", ["1::16::4::250", "2::10::3::55", "3::11::4::10"])
    inputs = history_spec(max_length=5)
    training = open_reader(inputs, DataChoice("movielens", str(train)))
    evaluated = open_reader(
        inputs, DataChoice("movielens", str(test)), vocabulary=training.vocabulary, training=training
    )
    (expected,) = epoch_batches(evaluated, global_batch=3, rank=0, world_size=1, bad_rows=BadRowLog(), num_workers=0)
    out = tmp_path / "test_prepared"
    settings = PrepareSettings(row_group_rows=4, workers=workers, training=str(train))
    prepare(inputs, DataChoice("movielens", str(test)), out, settings)
    (got,) = prepared_epoch_batches(open_prepared(inputs, out), global_batch=3, rank=0, world_size=1)
    for key in expected.batch.sparse.keys():
        assert got.batch.sparse[key].lengths().tolist() == expected.batch.sparse[key].lengths().tolist(), key
        assert got.batch.sparse[key].values().tolist() == expected.batch.sparse[key].values().tolist(), key
    assert got.batch.sparse["history"].lengths().tolist() == [3, 2, 0]  # the training past, as the eval reader
    assert read_vocabulary(out / "vocab.json").movies == training.vocabulary.movies
    alone = tmp_path / "alone"  # without the training ratings: the test file's own ids and past
    prepare(inputs, DataChoice("movielens", str(test)), alone, PrepareSettings(row_group_rows=4, workers=workers))
    assert read_vocabulary(alone / "vocab.json").movies != training.vocabulary.movies
