"""benchmarks/retrieval_figures.py at a small size: the commands it runs (in this process) and the figures it reads."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("retrieval_figures", REPO / "benchmarks" / "retrieval_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_ratings_plant_each_users_group_at_5_and_a_few_others_at_2(tmp_path: Path) -> None:
    script = _script()
    positives = script.write_ratings(tmp_path / "ratings.dat", users=40, movies=100)
    rows = [[int(x) for x in line.split("::")] for line in (tmp_path / "ratings.dat").read_text().splitlines()]
    assert positives == sum(1 for r in rows if r[2] == 5) == 40 * 2  # half of each group's 5 movies, rounded down
    assert all((r[1] % script.GROUPS == r[0] % script.GROUPS) == (r[2] == 5) for r in rows)
    assert sum(1 for r in rows if r[2] == 2) == 40 * 3


def test_popularity_recall_counts_the_held_out_positives_among_the_most_rated_training_movies(tmp_path: Path) -> None:
    script = _script()
    (tmp_path / "train.dat").write_text("1::7::5::1\n2::7::5::2\n3::8::5::3\n1::9::5::4\n2::9::5::5\n")
    (tmp_path / "test.dat").write_text("1::7::5::9\n2::8::5::9\n3::9::5::9\n4::5::5::9\n")
    assert script.popularity_recall(tmp_path / "train.dat", tmp_path / "test.dat", k=2) == 0.5  # top 2: 7 and 9


def test_a_small_run_reports_recall_per_epoch_and_each_index_against_exact_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.retrieval.index import faiss_available

    if not faiss_available():
        pytest.skip("faiss-cpu is not installed: the flat/ivf/hnsw indexes need it")
    script = _script()
    ran: list[list[str]] = []

    def in_this_process(command: list[str], check: bool, cwd: Path, stdout: int) -> None:
        """The script's `python -m compiler.cli ARGS` run as compiler.cli.main(ARGS) here: the same
        commands without an interpreter (and a torch import) each; a failure still fails the run."""
        from compiler.cli import main

        assert command[:3] == [sys.executable, "-m", "compiler.cli"] and check and cwd == REPO, command
        ran.append(command[3:])
        assert main(command[3:]) == 0, command

    monkeypatch.setattr(script, "subprocess", SimpleNamespace(run=in_this_process, DEVNULL=subprocess.DEVNULL))
    figures = script.run(tmp_path, users=300, movies=200, epochs=2)
    assert ["reccompile " + " ".join(args) for args in ran] == figures.commands
    assert [c.split()[1] for c in figures.commands] == ["data", "train", "export", "export", "export"]
    assert (
        "--eval-every 1 --steps 2 " in figures.commands[1]
    )  # 300 users x 5 positives, 4 each in training: one step of 1,024 an epoch
    assert [e["step"] for e in figures.epochs] == [1, 2]
    log = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["metrics"]["match"] for r in log if r["kind"] == "eval"]
    assert [(e["recall@10"], e["ndcg@10"]) for e in figures.epochs] == [(e["recall@10"], e["ndcg@10"]) for e in evals]
    assert set(figures.indexes) == {"flat", "ivf", "hnsw"}
    flat = figures.indexes["flat"]
    assert flat["ratio"] == 1.0 and flat["recall"] == flat["exact_recall"] and flat["k"] == 100
    for kind in ("ivf", "hnsw"):
        manifest = json.loads((tmp_path / f"export-{kind}" / "manifest.json").read_text())
        assert manifest["retrieval"]["index"]["kind"] == kind
        assert figures.indexes[kind]["ratio"] == manifest["retrieval"]["quality"]["ratio"]
