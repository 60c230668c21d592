"""Rank and worker splitting: every row once per epoch, the same global batches at any world size."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from sample_files import criteo_lines, criteo_spec, write_lines

from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.criteo.reader import CriteoReader
from runtime.data.loader import epoch_batches, training_batches

ROWS = 103
BAD_LINES = {7, 50, 51, 99}  # 1-based line numbers of malformed lines


def _file(tmp_path: Path) -> Path:
    lines = criteo_lines(ROWS, seed=3)
    for number in range(1, ROWS + 1):  # I1 carries the line number, so rows can be told apart
        fields = lines[number - 1].split("\t")
        fields[1] = str(number)
        lines[number - 1] = "\t".join(fields)
    for number in BAD_LINES:
        lines[number - 1] = lines[number - 1].replace("\t", "\tx", 1)
    return write_lines(tmp_path / "day_0.gz", lines, gzipped=True)


def _line_numbers(batch) -> list[int]:
    return torch.expm1(batch.dense["int"][:, 0].double()).round().long().tolist()


def _epoch(
    path: Path,
    world_size: int,
    workers: int,
    batch: int,
    block_lines: int,
    lines: int = ROWS,
    bad: int = len(BAD_LINES),
) -> list[list[list[int]]]:
    """[global batch][rank] -> the line numbers of that rank's real rows."""
    per_rank = []
    for rank in range(world_size):
        reader = CriteoReader(criteo_spec(), path)
        log = BadRowLog("skip")
        shares = epoch_batches(
            reader,
            global_batch=batch,
            rank=rank,
            world_size=world_size,
            bad_rows=log,
            num_workers=workers,
            block_lines=block_lines,
        )
        per_rank.append([(_line_numbers(s.batch), s.real, s.batch.batch_size) for s in shares])
        assert (log.rows, log.bad) == (lines, bad)  # every rank reads (and counts) every line
    sizes = {tuple(size for _, _, size in ranks) for ranks in zip(*per_rank)}
    assert all(len(set(s)) == 1 for s in sizes), "every rank's local batch has the same size"
    return [[numbers[:real] for numbers, real, _ in ranks] for ranks in zip(*per_rank)]


@pytest.mark.parametrize(("world_size", "workers", "block_lines"), [(1, 0, 1000), (2, 0, 7), (3, 2, 5), (4, 1, 64)])
def test_one_epoch_reads_every_good_row_once_in_the_same_global_batches(
    tmp_path: Path, world_size: int, workers: int, block_lines: int
) -> None:
    path = _file(tmp_path)
    good = [n for n in range(1, ROWS + 1) if n not in BAD_LINES]
    reference = [good[i : i + 12] for i in range(0, len(good), 12)]
    batches = _epoch(path, world_size, workers, batch=12, block_lines=block_lines)
    assert [sum(ranks, []) for ranks in batches] == reference
    if world_size > 1:  # contiguous slices: rank r's rows all come before rank r + 1's
        assert all(len(ranks[0]) == 12 // world_size for ranks in batches[:-1])


def test_the_last_partial_batch_pads_ranks_without_rows(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.txt", criteo_lines(9))
    batches = _epoch(path, world_size=4, workers=0, batch=8, block_lines=100, lines=9, bad=0)
    assert [len(rows) for rows in batches[-1]] == [1, 0, 0, 0]


def test_training_streams_epochs_and_ranks_concatenate_to_the_one_process_batches(tmp_path: Path) -> None:
    path = _file(tmp_path)
    steps = 30  # 30 x 8 rows: more than two epochs of 99 good rows
    good = [n for n in range(1, ROWS + 1) if n not in BAD_LINES]

    def stream(rank: int, world_size: int, workers: int) -> list[list[int]]:
        batches = training_batches(
            CriteoReader(criteo_spec(), path),
            global_batch=8,
            rank=rank,
            world_size=world_size,
            bad_rows=BadRowLog("skip"),
            num_workers=workers,
            block_lines=16,
        )
        return [_line_numbers(b) for b in itertools.islice(batches, steps)]

    single = stream(0, 1, 0)
    assert sum(single, []) == list(itertools.islice(itertools.cycle(good), steps * 8))
    ranks = [stream(rank, 2, 2) for rank in range(2)]
    assert [a + b for a, b in zip(*ranks)] == single
