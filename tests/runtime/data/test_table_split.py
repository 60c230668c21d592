"""runtime/data/tables/split.py: any table's latest rows held out, per key or in all, written atomically."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from sample_files import write_lines

from compiler.cli import main
from runtime.data.errors import DataError
from runtime.data.tables.split import held_out_rows, split_table

# user, item, ts, label: user a has 5 rows (times out of file order, a tie at 30), b has 2, c has 1.
HEADER = "user,item,ts,label"
ROWS = ["a,1,50,1", "b,2,10,0", "a,3,30,0", "a,4,20,1", "c,5,5,1", "a,6,30,1", "b,7,40,0", "a,8,10,0"]


def reference(rows: list[tuple[str, float]], holdout: float) -> list[bool]:
    """Held out by hand: each key's rows sorted by (time, line), the last ceil(h * n) (at most n - 1)."""
    held = [False] * len(rows)
    for key in {k for k, _ in rows}:
        mine = sorted((t, i) for i, (k, t) in enumerate(rows) if k == key)
        count = min(len(mine) - 1, math.ceil(holdout * len(mine)))
        for _, i in mine[len(mine) - count :]:
            held[i] = True
    return held


def test_held_out_rows_matches_a_plain_sort_per_key() -> None:
    generator = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 7, (300,), generator=generator)
    times = torch.randint(0, 20, (300,), generator=generator).double()  # many ties: line order decides
    for holdout in (0.1, 0.25, 0.5, 0.9):
        expected = reference(list(zip(keys.tolist(), times.tolist())), holdout)
        assert held_out_rows(keys, times, holdout).tolist() == expected


def test_a_csv_table_splits_per_key_by_time_with_its_lines_verbatim(tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in" / "events.csv", [HEADER, *ROWS])
    split = split_table("csv", source, tmp_path / "out", time="ts", key="user", holdout=0.4)
    # a: ceil(0.4 * 5) = 2 latest: 50 and the later line of the tie at 30 ("a,6"); b: 1 (40); c: none
    assert (tmp_path / "out" / "test" / "events.csv").read_text().splitlines() == [
        HEADER,
        "a,1,50,1",
        "a,6,30,1",
        "b,7,40,0",
    ]
    assert (tmp_path / "out" / "train" / "events.csv").read_text().splitlines() == [
        HEADER,
        "b,2,10,0",
        "a,3,30,0",
        "a,4,20,1",
        "c,5,5,1",
        "a,8,10,0",
    ]
    assert split.describe() == (
        f"8 rows of 3 keys (user) by ts: 5 train ({tmp_path / 'out' / 'train' / 'events.csv'}), "
        f"3 held out ({tmp_path / 'out' / 'test' / 'events.csv'})"
    )
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["events.csv", "events.csv", "test", "train"]


def test_ctr_rows_split_by_time_alone_and_a_validation_part_cuts_from_train(tmp_path: Path) -> None:
    source = write_lines(tmp_path / "rows.csv", [HEADER, *ROWS])
    split_table("csv", source, tmp_path / "split", time="ts", key=None, holdout=0.25)
    # the latest 2 of 8 by (ts, line): 50 and 40
    assert (tmp_path / "split" / "test" / "rows.csv").read_text().splitlines() == [HEADER, "a,1,50,1", "b,7,40,0"]
    split_table("csv", tmp_path / "split" / "train" / "rows.csv", tmp_path / "fit", time="ts", key=None, holdout=0.34)
    # of the 6 left, ceil(0.34 * 6) = 3 latest: both rows at 30 and the one at 20
    assert (tmp_path / "fit" / "test" / "rows.csv").read_text().splitlines() == [
        HEADER,
        "a,3,30,0",
        "a,4,20,1",
        "a,6,30,1",
    ]


def test_criteo_holds_out_its_latest_lines_across_day_files(tmp_path: Path) -> None:
    write_lines(tmp_path / "days" / "day_2", ["1\tb", "0\tc"])
    write_lines(tmp_path / "days" / "day_10", ["1\td"])
    write_lines(tmp_path / "days" / "day_1", ["0\ta"])
    split = split_table("criteo", tmp_path / "days", tmp_path / "out", time=None, key=None, holdout=0.5)
    assert (tmp_path / "out" / "train" / "rows.txt").read_text() == "0\ta\n1\tb\n"
    assert (tmp_path / "out" / "test" / "rows.txt").read_text() == "0\tc\n1\td\n"
    assert split.order == "line order (criteo lines are in time order)"


def test_a_parquet_table_splits_per_key_and_keeps_its_schema(tmp_path: Path) -> None:
    from runtime.data.files.arrow import pa, pq

    users = [r.split(",")[0] for r in ROWS]
    times = [int(r.split(",")[2]) for r in ROWS]
    table = pa.table({"user": users, "item": list(range(len(ROWS))), "ts": pa.array(times, pa.timestamp("s"))})
    pq.write_table(table, tmp_path / "events.parquet")
    split_table("parquet", tmp_path / "events.parquet", tmp_path / "out", time="ts", key="user", holdout=0.4)
    test = pq.read_table(tmp_path / "out" / "test" / "events.parquet")
    train = pq.read_table(tmp_path / "out" / "train" / "events.parquet")
    assert test.column("item").to_pylist() == [0, 5, 6]
    assert test.schema == train.schema == pq.read_table(tmp_path / "events.parquet").schema
    assert train.column("item").to_pylist() == [1, 2, 3, 4, 7]


@pytest.mark.parametrize(
    ("lines", "options", "message"),
    [
        ([HEADER, "a,1,x,1"], {"time": "ts", "key": "user"}, "{file}:2: column 'ts' ('x'): not a number"),
        ([HEADER, "a,1,5"], {"time": "ts", "key": None}, "{file}:2: 3 fields, the header names 4"),
        ([HEADER, "a,1,5,1"], {"time": "when", "key": None}, "{file}:1: the header has no column 'when'"),
        ([HEADER], {"time": "ts", "key": None}, "{file}: no data lines to split"),
    ],
)
def test_bad_input_is_named_and_nothing_is_written(tmp_path: Path, lines, options, message: str) -> None:
    source = write_lines(tmp_path / "rows.csv", lines)
    with pytest.raises(DataError) as error:
        split_table("csv", source, tmp_path / "out", holdout=0.5, **options)
    assert str(error.value) == message.format(file=source)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.csv"))


def test_the_command_splits_tables_and_refuses_what_cannot_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = write_lines(tmp_path / "rows.csv", [HEADER, *ROWS])
    out = tmp_path / "out"
    assert main(["data", "split", "--data", f"csv:{source}", "--time", "ts", "--key", "user", "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith("split 8 rows of 3 keys (user) by ts: 6 train (")
    before = (out / "train" / "rows.csv").read_bytes()
    assert main(["data", "split", "--data", f"csv:{source}", "--time", "ts", "-o", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"error: {out / 'train'}: already exists (an earlier split?); choose another -o, or remove it to split again\n"
    )
    assert (out / "train" / "rows.csv").read_bytes() == before
    assert main(["data", "split", "--data", f"csv:{source}", "-o", str(tmp_path / "o")]) == 2
    assert (
        capsys.readouterr().err
        == f"error: --data csv:{source}: name the column the rows are ordered by (--time COLUMN)\n"
    )
    assert main(["data", "split", "--data", f"criteo:{source}", "--time", "ts", "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == "error: --time: criteo data is split without it (its lines are in time order)\n"
