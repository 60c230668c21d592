"""runtime/data/tables: CSV columns mapped by data.columns to dense, ids, hashed strings, sequences, labels."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import pytest
import torch
from sample_files import spec, write_lines

from runtime.config.data import TimestampsConfig
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches
from runtime.data.prepared.batches import prepared_epoch_batches
from runtime.data.prepared.prepare import PrepareSettings, prepare
from runtime.data.prepared.reading import open_prepared
from runtime.data.sources import DataChoice, choose_data, open_reader

COLUMNS = {
    "price": "num",
    "age": "num",
    "user": "user",
    "item": "item",
    "seen": "history",
    "seen_at": "history_time",
    "clicked": "click",
}
LINES = [
    "clicked,price,user,item,seen,seen_at,age,note",
    "1,2.5,alice,17,3|4|5,10|20|30,40,x",
    '0,,bob,-3,,,7,"a, quoted"',
    "1,1e2,alice,1000,9,50,1,",
    "yes,1,carol,2,,,3,",
]


def _inputs(path: Path, columns: dict[str, str] = COLUMNS):
    inputs = spec(
        [{"name": "num", "size": 2}],
        [
            {"name": "user", "table": "user"},
            {"name": "item", "table": "item"},
            {"name": "history", "table": "item", "max_length": 2, "fixed_ids": False},
        ],
        {"user": 50, "item": 100},
        [{"name": "click", "label": "click", "loss": "bce"}],
        {"reader": "csv", "path": str(path), "columns": columns},
    )
    return dataclasses.replace(inputs, timestamps=(TimestampsConfig("history_time", "history"),))


def _hashed(text: str, rows: int) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % rows


def test_columns_feed_dense_ids_hashed_strings_sequences_and_labels(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "clicks.csv", LINES)
    inputs = _inputs(path)
    reader = open_reader(inputs, choose_data(None, inputs))
    bad = BadRowLog("skip")
    (local,) = epoch_batches(reader, global_batch=3, rank=0, world_size=1, bad_rows=bad, num_workers=0)
    batch = local.batch
    assert batch.dense["num"].tolist() == [[2.5, 40.0], [0.0, 7.0], [100.0, 1.0]]
    assert batch.labels["click"].tolist() == [1.0, 0.0, 1.0]
    assert batch.sparse["user"].values().tolist() == [_hashed("alice", 50), _hashed("bob", 50), _hashed("alice", 50)]
    assert batch.sparse["item"].values().tolist() == [17, -3 % 100, 0]
    assert batch.sparse["history"].lengths().tolist() == [2, 0, 1]  # max_length 2, keep end
    assert batch.sparse["history"].values().tolist() == [4, 5, 9]
    assert batch.sparse["history_time"].values().tolist() == [20, 30, 50]
    assert [str(row) for row in bad.examples] == [f"{path}:5: column clicked: not a number (value 'yes')"]


def test_rows_with_a_value_the_spec_cannot_train_on_are_bad_rows_naming_the_column(tmp_path: Path) -> None:
    rows = [
        "nan,2.5,alice,17,3,10,40,",  # line 2
        "1,inf,alice,17,3,10,40,",
        "7,2.5,alice,17,3,10,40,",
        "0.5,2.5,alice,--5,3,10,-1e999,",  # a soft label; '--5' is no integer: hashed like any string
        "1,2.5,alice,²,3,10,40,",  # not ASCII digits: hashed too
        "0,2.5,bob,17,3,1²,40,",
    ]
    path = tmp_path / "clicks.csv"
    path.write_text("\n".join([LINES[0], *rows]) + "\n", encoding="utf-8")
    reader = open_reader(_inputs(path), DataChoice("csv", str(path)))
    bad = BadRowLog("skip")
    (local,) = epoch_batches(reader, global_batch=2, rank=0, world_size=1, bad_rows=bad, num_workers=0)
    assert [str(row) for row in bad.examples] == [
        f"{path}:2: column clicked: not a finite number (value 'nan')",
        f"{path}:3: column price: not a finite number (value 'inf')",
        f"{path}:4: column clicked: a bce label must be in [0, 1] (value '7')",
        f"{path}:5: column age: not a finite number (value '-1e999')",
        f"{path}:7: column seen_at: not an integer time (value '1²')",
    ]
    assert local.batch.labels["click"].tolist() == [1.0]
    assert local.batch.sparse["item"].values().tolist() == [_hashed("²", 100)]


def test_timestamps_must_time_every_id_of_their_sequence_before_either_is_cut(tmp_path: Path) -> None:
    rows = [
        "1,2.5,alice,17,3|4,10,40,",  # line 2: 2 ids, 1 time
        "1,2.5,alice,17,3|4|5,10|20|30|40,40,",  # both cut to max_length 2, but 3 ids and 4 times
        "0,2.5,bob,17,3|4|5,10|20|30,40,",
    ]
    path = write_lines(tmp_path / "clicks.csv", [LINES[0], *rows])
    reader = open_reader(_inputs(path), DataChoice("csv", str(path)))
    bad = BadRowLog("skip")
    (local,) = epoch_batches(reader, global_batch=1, rank=0, world_size=1, bad_rows=bad, num_workers=0)
    assert [str(row) for row in bad.examples] == [
        f"{path}:2: column seen_at: 1 times but its sequence 'history' (column seen) has 2 ids (value '10')",
        f"{path}:3: column seen_at: 4 times but its sequence 'history' (column seen) has 3 ids (value '10|20|30|40')",
    ]
    assert local.batch.sparse["history_time"].values().tolist() == [20, 30]


def test_a_line_that_is_not_utf8_is_a_bad_row_not_a_string_with_replaced_bytes(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "clicks.csv", [LINES[0], "1,2.5,café,17,3,10,40,", "0,2.5,cafè,17,3,10,40,", LINES[2]]
    )
    reader = open_reader(_inputs(path), DataChoice("csv", str(path)))  # write_lines writes latin-1
    bad = BadRowLog("skip")
    (local,) = epoch_batches(reader, global_batch=1, rank=0, world_size=1, bad_rows=bad, num_workers=0)
    assert [str(row) for row in bad.examples] == [
        f"{path}:2: not UTF-8 text (byte 0xe9 at position 9) (value '1,2.5,caf\ufffd,17,3,10,40,')",
        f"{path}:3: not UTF-8 text (byte 0xe8 at position 9) (value '0,2.5,caf\ufffd,17,3,10,40,')",
    ]
    assert local.batch.sparse["user"].values().tolist() == [_hashed("bob", 50)]
    header = write_lines(tmp_path / "latin" / "a.csv", [LINES[0] + ",café", LINES[2] + ",x"])
    with pytest.raises(DataError, match=f"^{re.escape(str(header))}:1: the header is not UTF-8 text "):
        open_reader(_inputs(header), DataChoice("csv", str(header)))


def test_a_softmax_label_must_be_one_of_its_classes(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "genres.csv",
        [
            "clicked,price,user,item,seen,seen_at,age",
            *(f"{label},1,alice,17,3,10,40" for label in ("2", "0", "3", "1.5", "-1")),
        ],
    )
    inputs = _inputs(path)
    head = dataclasses.replace(inputs.heads[0], loss="softmax", num_classes=3)
    reader = open_reader(dataclasses.replace(inputs, heads=(head,)), DataChoice("csv", str(path)))
    bad = BadRowLog("skip")
    (local,) = epoch_batches(reader, global_batch=2, rank=0, world_size=1, bad_rows=bad, num_workers=0)
    assert local.batch.labels["click"].tolist() == [2.0, 0.0]
    assert [str(row) for row in bad.examples] == [
        f"{path}:{line}: column clicked: a softmax label must be a class number 0..2 (value '{value}')"
        for line, value in ((4, "3"), (5, "1.5"), (6, "-1"))
    ]


def test_a_csv_file_prepares_like_any_reader(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "clicks.csv", LINES)
    inputs = _inputs(path)
    prepare(inputs, DataChoice("csv", str(path)), tmp_path / "out", PrepareSettings(row_group_rows=2, workers=0))
    (got,) = prepared_epoch_batches(open_prepared(inputs, tmp_path / "out"), global_batch=3, rank=0, world_size=1)
    assert got.batch.sparse["history"].values().tolist() == [4, 5, 9]
    assert torch.equal(got.batch.dense["num"], torch.tensor([[2.5, 40.0], [0.0, 7.0], [100.0, 1.0]]))


def test_mapping_errors_name_the_feature_or_column(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "clicks.csv", LINES)
    short = {k: v for k, v in COLUMNS.items() if k != "age"}
    with pytest.raises(DataError, match=r"^dense feature 'num' has size 2 but 1 columns feed it \(price\)$"):
        open_reader(_inputs(path, short), DataChoice("csv", str(path)))
    unfed = {k: v for k, v in COLUMNS.items() if k != "seen_at"}
    with pytest.raises(DataError, match=r"^history_time is fed by no column of data.columns$"):
        open_reader(_inputs(path, unfed), DataChoice("csv", str(path)))
    with pytest.raises(DataError, match=rf"^{path}:1: the header has no column 'price2' \(data.columns maps it\)$"):
        open_reader(_inputs(path, {**short, "price2": "num"}), DataChoice("csv", str(path)))
