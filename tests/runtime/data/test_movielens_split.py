"""MovieLens positives split by time per user (runtime.data.movielens.split, `reccompile data split`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sample_files import write_lines

from compiler.cli import main
from runtime.data.errors import DataError
from runtime.data.movielens.split import split_by_time

# user 1: five positives (one 3-star rating dropped), two of them share a timestamp;
# user 2: one positive (never held out); user 3: two positives.
LINES = [
    (1, 10, 5, 300),
    (1, 11, 4, 100),
    (2, 10, 5, 50),
    (1, 12, 3, 150),
    (1, 13, 4, 200),
    (1, 14, 5, 400),
    (3, 11, 4, 10),
    (1, 15, 4, 400),
    (3, 99, 5, 20),
]


def _write(path: Path, layout: str) -> Path:
    if layout == "tab":
        return write_lines(path / "u.data", ["\t".join(map(str, r)) for r in LINES])
    if layout == "dat":
        write_lines(path / "movies.dat", [f"{m}::Movie {m}::Drama" for m in (10, 11, 12, 13, 14, 15, 99)])
        return write_lines(path / "ratings.dat", ["::".join(map(str, r)) for r in LINES])
    return write_lines(
        path / "ratings.csv", ["userId,movieId,rating,timestamp", *(",".join(map(str, r)) for r in LINES)]
    )


def _rows(path: Path, separator: str, skip: int = 0) -> list[tuple[int, ...]]:
    return [tuple(int(float(v)) for v in line.split(separator)) for line in path.read_text().splitlines()[skip:]]


@pytest.mark.parametrize("layout, separator", [("tab", "\t"), ("dat", "::"), ("csv", ",")])
def test_each_users_latest_positives_are_held_out_in_the_inputs_layout(
    tmp_path: Path, layout: str, separator: str
) -> None:
    source = _write(tmp_path / "in", layout)
    split = split_by_time(source, tmp_path / "out", holdout=0.3)
    skip = 1 if layout == "csv" else 0
    assert split.train == tmp_path / "out" / "train" / source.name
    # user 1: 5 positives, ceil(0.3 * 5) = 2 held out: the two at t=400, in file order;
    # user 3: 2 positives, ceil(0.6) = 1 held out (t=20); user 2 keeps its only positive.
    assert _rows(split.train, separator, skip) == [
        (1, 10, 5, 300),
        (1, 11, 4, 100),
        (2, 10, 5, 50),
        (1, 13, 4, 200),
        (3, 11, 4, 10),
    ]
    assert _rows(split.test, separator, skip) == [(1, 14, 5, 400), (1, 15, 4, 400), (3, 99, 5, 20)]
    if layout == "csv":
        assert split.test.read_text().splitlines()[0] == "userId,movieId,rating,timestamp"
    if layout == "dat":  # the movies file goes along: genres read the same in both parts
        assert (split.test.parent / "movies.dat").read_text() == (source.parent / "movies.dat").read_text()
    assert (split.users, split.positives, split.dropped) == (3, 8, 1)
    assert (split.train_rows, split.test_rows, split.test_users, split.unseen_movies) == (5, 3, 2, 3)
    assert split.describe() == (
        f"3 users, 8 positives (1 below the threshold dropped): 5 train ({split.train}), 3 held out of 2 users "
        f"({split.test}); held-out positives of movies training never sees: 3"
    )


def test_the_threshold_decides_what_is_a_positive(tmp_path: Path) -> None:
    split = split_by_time(_write(tmp_path / "in", "dat"), tmp_path / "out", threshold=5.0, holdout=0.5)
    assert _rows(split.train, "::") == [(1, 10, 5, 300), (2, 10, 5, 50), (3, 99, 5, 20)]
    assert _rows(split.test, "::") == [(1, 14, 5, 400)]


def test_a_bad_line_stops_the_split_naming_file_line_and_column(tmp_path: Path) -> None:
    source = write_lines(tmp_path / "ratings.dat", ["1::10::5::300", "1::x7::4::100"])
    with pytest.raises(DataError) as error:
        split_by_time(source, tmp_path / "out")
    assert str(error.value) == f"{source}:2: column movieId ('x7'): not a non-negative integer"
    none = write_lines(tmp_path / "low" / "ratings.dat", ["1::10::2::300"])
    with pytest.raises(DataError) as error:
        split_by_time(none, tmp_path / "out")
    assert str(error.value) == f"{none}: no rating reaches the threshold 4: there are no positives to split"


def test_the_command_prints_the_split_and_refuses_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = _write(tmp_path / "in", "tab")
    assert main(["data", "split", "--data", f"movielens:{source}", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("split 3 users, 8 positives (1 below the threshold dropped): 6 train (")
    assert main(["data", "split", "--data", f"tsv:{source}", "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        f"error: --data tsv:{source}: split reads movielens:PATH, csv:PATH, parquet:PATH, criteo:PATH\n"
    )
    assert main(["data", "split", "--data", f"movielens:{source}", "--key", "u", "-o", str(tmp_path / "o")]) == 2
    assert (
        capsys.readouterr().err
        == "error: --key: movielens data is split without it (users and timestamps are its own)\n"
    )
    assert main(["data", "split", "--data", f"movielens:{source}", "--holdout", "1", "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == "error: --holdout must be between 0 and 1 (exclusive), got 1\n"
    assert main(["data", "split", "--data", f"movielens:{tmp_path / 'nope'}", "-o", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope'}: no such file or directory\n"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_outdir_holding_the_input_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    source = _write(tmp_path / "X" / "train", "dat")
    before = _snapshot(tmp_path)
    assert main(["data", "split", "--data", f"movielens:{source}", "-o", str(tmp_path / "X")]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        (
            f"error: {source}: an input of this split, in {tmp_path / 'X' / 'train'}, which the split writes; "
            "choose another -o\n"
        ),
    )
    assert _snapshot(tmp_path) == before


def test_an_outdir_holding_a_split_is_refused_and_the_split_kept(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = _write(tmp_path / "one", "tab")
    assert main(["data", "split", "--data", f"movielens:{first}", "-o", str(tmp_path / "out")]) == 0
    other = write_lines(tmp_path / "two" / "u.data", ["7\t10\t5\t1", "7\t11\t5\t2"])
    capsys.readouterr()
    for leftover in ("train", "test"):
        kept = _snapshot(tmp_path / "out")
        assert main(["data", "split", "--data", f"movielens:{other}", "-o", str(tmp_path / "out")]) == 1
        assert capsys.readouterr().err == (
            f"error: {tmp_path / 'out' / leftover}: already exists (an earlier split?); choose another -o, "
            "or remove it to split again\n"
        )
        assert _snapshot(tmp_path / "out") == kept
        shutil.rmtree(tmp_path / "out" / leftover)  # then test/ alone is refused too
    file = tmp_path / "file"
    file.write_text("mine")
    assert main(["data", "split", "--data", f"movielens:{other}", "-o", str(file)]) == 1
    assert capsys.readouterr().err == f"error: {file}: exists and is not a directory; choose another -o\n"
    assert file.read_text() == "mine"
