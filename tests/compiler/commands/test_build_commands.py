"""`reccompile SPEC`, `reccompile graph` and `reccompile train` (one process) end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compiler.cli import main

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def test_compile_writes_the_module_and_plan_and_summarises(tmp_path: Path, capsys) -> None:
    assert main(["specs/dlrm_criteo.yaml", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out.replace(str(tmp_path), "OUT")
    assert out == (
        "dlrm_criteo: 1 dense and 26 sparse features, 26 tables, 3 blocks, 1 head\n"
        "parameters: 166,400,000 in embeddings, 499,521 dense\n"
        "plan: world size 1 on cpu; 26 table_wise\n"
        "wrote OUT/dlrm_criteo.py\n"
        "wrote OUT/dlrm_criteo.plan.json\n"
    )
    plan = json.loads((tmp_path / "dlrm_criteo.plan.json").read_text())
    assert plan["world_size"] == 1 and len(plan["tables"]) == 26


def test_compile_counts_an_auxiliary_loss_network_among_the_dense_parameters(tmp_path: Path, capsys) -> None:
    spec = REPO / "tests" / "specs" / "valid" / "dien_aux_loss.yaml"
    without = tmp_path / "without.yaml"
    without.write_text(spec.read_text().replace("aux_loss: {weight: 0.5}", "aux_loss: {weight: 0}"))
    counts = []
    for path in (spec, without):
        assert main([str(path), "-o", str(tmp_path / path.stem)]) == 0
        counts.append(int(re.search(r"([\d,]+) dense\n", capsys.readouterr().out).group(1).replace(",", "")))
    inputs = 5 + 4  # the gru's state and the item row, concatenated: -> 100 -> 50 -> 2
    assert counts[0] - counts[1] == (inputs * 100 + 100) + (100 * 50 + 50) + (50 * 2 + 2)


def test_graph_prints_the_golden_text(capsys) -> None:
    assert main(["graph", "specs/dlrm_criteo.yaml", "--world-size", "2"]) == 0
    expected = (REPO / "tests" / "golden" / "dlrm_criteo.ws2.graph.txt").read_text()
    assert capsys.readouterr().out == expected


def test_a_bad_spec_exits_1_with_diagnostics(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        (REPO / "specs" / "dlrm_criteo.yaml").read_text().replace("input: interaction", "input: interactoin")
    )
    assert main([str(spec), "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err.replace(str(tmp_path), "TMP")
    assert "error: model.top.input: unknown block 'interactoin' (did you mean 'interaction'?)" in err
    assert err.endswith("1 error\n")


def _train(tmp_path: Path, capsys, seed: int) -> list[str]:
    code = main(
        [
            "train",
            "specs/two_tower_movielens.yaml",
            "--steps",
            "6",
            "--batch-size",
            "64",
            "--seed",
            str(seed),
            "--log-every",
            "3",
            "-o",
            str(tmp_path),
        ]
    )
    assert code == 0
    return capsys.readouterr().out.splitlines()


def test_train_prints_progress_then_one_json_line(tmp_path: Path, capsys) -> None:
    lines = _train(tmp_path, capsys, seed=3)
    assert re.fullmatch(
        r"training two_tower_movielens on 1 rank: \d+ threads? per rank \(\d+ of \d+ cores free\)", lines[0]
    )
    assert [line.split()[:2] for line in lines[1:-1]] == [["step", "3/6"], ["step", "6/6"]]
    summary = json.loads(lines[-1])
    assert set(summary) == {
        "steps",
        "samples_per_s",
        "loss_first",
        "loss_last",
        "eval_seconds",
        "checkpoint_seconds",
        "metrics",
    }
    assert set(summary["metrics"]["like"]) == {"ne", "auc", "accuracy"}
    assert summary["steps"] == 6 and summary["samples_per_s"] > 0


def test_train_is_deterministic_for_a_seed(tmp_path: Path, capsys) -> None:
    first = json.loads(_train(tmp_path, capsys, seed=5)[-1])
    second = json.loads(_train(tmp_path, capsys, seed=5)[-1])
    other = json.loads(_train(tmp_path, capsys, seed=6)[-1])
    assert (first["loss_first"], first["loss_last"]) == (second["loss_first"], second["loss_last"])
    assert first["loss_last"] != other["loss_last"]


def test_a_plan_file_that_is_not_text_is_a_diagnostic(tmp_path: Path, capsys) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(b'{"format_version": 1,\n  "tables": \x89PNG\x00')
    assert main(["specs/dlrm_criteo.yaml", "--plan", str(plan), "-o", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == f"{plan}:2:13: error: not a plan: byte 0x89 is not UTF-8 text\n1 error\n"


def test_predict_refuses_an_output_directory_before_reading_anything(tmp_path: Path, capsys) -> None:
    # The export does not exist: the -o check comes first, so nothing was loaded or scored.
    assert main(["predict", str(tmp_path / "no_export"), "-o", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", f"error: -o {tmp_path}: is a directory; name the CSV file to write\n")
