"""benchmarks/movielens_bench.py: the validation cut, the per-epoch schedule and log reading, and the argument check."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("movielens_bench", REPO / "benchmarks" / "movielens_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_validation_cut_holds_out_each_users_latest_training_rating(bench, tmp_path: Path) -> None:
    ratings = [(user, item, 3, 1000 * user + 10 * item) for user in (1, 2, 3) for item in range(1, 6)]
    data = tmp_path / "ml" / "u.data"
    data.parent.mkdir()
    data.write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in ratings))
    bench.leave_one_out(data, tmp_path / "split")
    bench.leave_one_out(tmp_path / "split" / "train" / "u.data", tmp_path / "validation")

    def rows(part: str) -> set[tuple[int, int, int]]:
        return set(bench.read(tmp_path / part / "u.data"))

    by_time = sorted(ratings, key=lambda row: row[3])
    latest = {(u, i, t) for u, i, _, t in by_time if i == 5}
    second = {(u, i, t) for u, i, _, t in by_time if i == 4}
    assert rows("split/test") == latest
    assert rows("validation/test") == second
    assert rows("validation/train") == {(u, i, t) for u, i, _, t in ratings} - latest - second


@pytest.mark.parametrize(
    ("epochs", "rows", "batch", "every_epoch", "expected"),
    [(10, 1000, 128, False, (70, None)), (10, 1000, 128, True, (70, 7)), (2, 50, 128, True, (2, 1))],
)
def test_the_schedule_runs_whole_epochs(bench, epochs, rows, batch, every_epoch, expected) -> None:
    assert bench.schedule(epochs, rows, batch, every_epoch) == expected


def test_eval_passes_reads_each_evaluation_in_order(bench, tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    records = [
        {"kind": "train", "step": 1, "metrics": {"loss": 1.0}},
        {"kind": "eval", "step": 7, "metrics": {"test": {"recall@10": 0.1, "ndcg@10": 0.05}}},
        {"kind": "eval", "step": 14, "metrics": {"test": {"recall@10": 0.2, "ndcg@10": 0.07}}},
    ]
    log.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert bench.eval_passes(log) == [{"recall@10": 0.1, "ndcg@10": 0.05}, {"recall@10": 0.2, "ndcg@10": 0.07}]


def test_a_spec_needs_exactly_one_model(bench, capsys) -> None:
    args = bench.parse_args(["--spec", "my.yaml", "--models", "sasrec", "--validation", "--every-epoch"])
    assert (args.spec, args.models, args.validation, args.every_epoch) == (Path("my.yaml"), "sasrec", True, True)
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(["--spec", "my.yaml", "--models", "sasrec,hstu"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: --spec needs exactly one model in --models")
