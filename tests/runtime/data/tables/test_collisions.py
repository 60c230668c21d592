"""runtime/data/tables/collisions.py: distinct values of hashed features and how many share a row."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.collisions import Collisions, count_collisions
from runtime.features.hashing import hash_id
from sample_files import spec, write_lines


def _reader(path: Path, rows: int):
    inputs = spec(
        [],
        [{"name": "user", "table": "user"}],
        {"user": rows},
        [{"name": "click", "label": "click", "loss": "bce"}],
        {"reader": "csv", "path": str(path), "columns": {"user": "user", "click": "click"}},
    )
    return open_reader(inputs, DataChoice("csv", str(path)))


def test_values_sharing_a_row_are_counted_against_the_hash(tmp_path: Path) -> None:
    values = [f"u{i}" for i in range(200)] + ["u3", "7", "57"]  # 7 and 57 share row 7 of 50 (integers mod rows)
    path = write_lines(tmp_path / "t.csv", ["user,click", *(f"{v},1" for v in values)])
    (found,) = count_collisions(_reader(path, 50))
    rows = Counter(hash_id(v, 50) for v in set(values))
    assert found == Collisions("user", 50, len(values), 202, sum(n for n in rows.values() if n > 1))
    assert found.warning() == (
        f"feature user: {found.share:.1%} of its distinct values share a row (above 1%): give it a `vocabulary` "
        "(learned ids) or more num_embeddings"
    )


def test_few_values_in_a_large_table_do_not_warn_and_a_limit_reads_the_first_rows(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.csv", ["user,click", "a,1", "b,0", "c,1", "d,0"])
    (found,) = count_collisions(_reader(path, 1 << 40), rows=3)
    assert (found.rows_read, found.distinct, found.shared, found.warning()) == (3, 3, 0, None)
    assert (
        found.describe() == "feature user: 3 distinct values in 3 rows; 0 (0.0%) share a row of its 1,099,511,627,776"
    )
