"""The Criteo reader: DLRM's transforms, plain / gzip / CRLF files, bad rows, the column mapping."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from sample_files import criteo_lines, criteo_spec, write_lines

from runtime.data.checks.bad_rows import BadRowError, BadRowLog
from runtime.data.criteo.reader import CriteoReader, criteo_layout
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches

INTS = "1\t5\t-2\t\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9\t"  # the label, then I1..I13 (I3 empty)
LINE = INTS + "\t".join(["00000010", "", "ffffffff", "FEDCBA9876543210"] + ["a"] * 22)


def _one_epoch(reader, batch: int = 1000, policy: str = "fail", log: BadRowLog | None = None):
    log = log or BadRowLog(policy)
    locals_ = list(epoch_batches(reader, global_batch=batch, rank=0, world_size=1, bad_rows=log, num_workers=0))
    return [b.batch for b in locals_], log


def test_a_line_becomes_dlrm_features(tmp_path: Path) -> None:
    reader = CriteoReader(criteo_spec(rows=7), write_lines(tmp_path / "day_0", [LINE]))
    (batch,), _ = _one_epoch(reader)
    ints = [5, -2, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # empty -> 0
    expected = torch.tensor([[math.log1p(max(x, 0)) for x in ints]])
    torch.testing.assert_close(batch.dense["int"], expected)
    assert batch.labels["click"].tolist() == [1.0]
    ids = [batch.sparse[f"cat_{i}"].values().item() for i in range(4)]
    assert ids == [0x10 % 7, 0, 0xFFFFFFFF % 7, 0xFEDCBA9876543210 % 7]  # empty -> 0; value mod rows
    assert batch.sparse.keys() == [f"cat_{i}" for i in range(26)]


def test_plain_gzip_and_crlf_files_read_the_same(tmp_path: Path) -> None:
    lines = criteo_lines(40)
    batches = {}
    for name, kwargs in {"plain": {}, "gzip": {"gzipped": True}, "crlf": {"crlf": True}}.items():
        reader = CriteoReader(criteo_spec(), write_lines(tmp_path / f"{name}.txt", lines, **kwargs))
        batches[name], _ = _one_epoch(reader)
    for name in ("gzip", "crlf"):
        assert torch.equal(batches[name][0].dense["int"], batches["plain"][0].dense["int"])
        assert torch.equal(batches[name][0].sparse.values(), batches["plain"][0].sparse.values())


def test_a_directory_is_read_day_by_day_in_natural_order(tmp_path: Path) -> None:
    for day in (10, 2, 1):
        write_lines(tmp_path / f"day_{day}.gz", [LINE.replace("1\t5\t", f"0\t{day}\t", 1)], gzipped=True)
    reader = CriteoReader(criteo_spec(), tmp_path)
    (batch,), _ = _one_epoch(reader)
    days = torch.expm1(batch.dense["int"][:, 0]).round().tolist()
    assert days == [1.0, 2.0, 10.0]


BAD = {
    "fields": ("1\t2\t3", "3 tab-separated fields, expected 40 (label, I1..I13, C1..C26)", None),
    "label": (LINE.replace("1", "2", 1), "the label must be 0 or 1", "label"),
    "int": (LINE.replace("\t-2\t", "\t-2x\t"), "not an integer of at most 18 digits", "I2"),
    "hex": (LINE.replace("ffffffff", "fffz"), "not hexadecimal of at most 16 digits", "C3"),
    "long hex": (LINE.replace("ffffffff", "f" * 17), "not hexadecimal of at most 16 digits", "C3"),
    "empty label": (LINE[1:], "the label must be 0 or 1", "label"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_row_fails_naming_file_line_column_and_value(tmp_path: Path, case: str) -> None:
    bad_line, reason, column = BAD[case]
    path = write_lines(tmp_path / "day.txt", [LINE, LINE, bad_line, LINE])
    with pytest.raises(BadRowError) as caught:
        _one_epoch(CriteoReader(criteo_spec(), path))
    row = caught.value.row
    assert (row.file, row.line, row.column, row.reason) == (str(path), 3, column, reason)
    assert str(caught.value).startswith(f"{path}:3: ")
    assert "--bad-rows skip" in str(caught.value)


def test_skipped_rows_are_counted_reported_and_summarised(tmp_path: Path) -> None:
    lines = criteo_lines(30)
    lines[4] = BAD["hex"][0]
    lines[20] = BAD["fields"][0]
    warnings: list[str] = []
    log = BadRowLog("skip", warn=warnings.append)
    batches, _ = _one_epoch(CriteoReader(criteo_spec(), write_lines(tmp_path / "d.txt", lines)), log=log)
    assert sum(b.batch_size for b in batches) == 28
    assert (log.rows, log.bad) == (30, 2)
    assert [row.line for row in log.examples] == [5, 21]
    assert warnings[0] == (
        f"skipped bad row {tmp_path / 'd.txt'}:5: column C3: not hexadecimal of at most 16 digits (value 'fffz')"
    )
    summary = log.summary()
    assert summary is not None and summary.splitlines()[0] == "skipped 2 bad rows of 30 read; the first:"


def test_default_mapping_needs_26_sparse_features_and_names_both_counts() -> None:
    message = r"26 categorical columns \(C1..C26\) but the spec has 3 sparse features \(cat_0, cat_1, cat_2\)"
    with pytest.raises(DataError, match=message):
        criteo_layout(criteo_spec(sparse_count=3))


def test_the_spec_columns_map_a_subset_and_keep_defaults_for_the_rest() -> None:
    columns = {"C5": "cat_0", "C1": "cat_2", "C2": "cat_1", "label": "click"}
    layout = criteo_layout(criteo_spec(sparse_count=3, data={"reader": "criteo", "path": "x", "columns": columns}))
    assert [(name, column) for name, column, _ in layout.sparse] == [("cat_0", 4), ("cat_1", 1), ("cat_2", 0)]
    swapped = {"reader": "criteo", "path": "x", "columns": {"C1": "cat_1", "C2": "cat_0"}}
    full = criteo_layout(criteo_spec(data=swapped))
    assert [c for _, c, _ in full.sparse][:4] == [1, 0, 2, 3]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"X1": "cat_0"}, r"'X1' is not a criteo column"),
        ({"I1": "cat_0"}, r"data.columns.I1: an integer column feeds a dense feature, not 'cat_0'"),
        ({"I1": "int"}, r"dense feature 'int' has size 13 but 1 criteo integer columns feed it \(I1\)"),
        ({"label": "cat_0"}, r"the label column feeds a head label, not 'cat_0'"),
    ],
)
def test_mapping_errors_name_the_column_and_the_target(columns: dict[str, str], message: str) -> None:
    with pytest.raises(DataError, match=message):
        criteo_layout(criteo_spec(data={"reader": "criteo", "path": "x", "columns": columns}))


def test_a_second_head_without_a_column_is_an_error() -> None:
    spec = criteo_spec()
    spec = dataclasses.replace(spec, heads=(*spec.heads, dataclasses.replace(spec.heads[0], name="cvr", label="cvr")))
    with pytest.raises(DataError, match="head 'cvr' reads label 'cvr', which no criteo column feeds"):
        criteo_layout(spec)
