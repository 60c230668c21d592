"""compiler/commands/plan.py: `reccompile plan SPEC ...` end to end on specs/dlrm_criteo.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler.cli import main
from compiler.planner.plan import ShardingPlan

SPEC = "specs/dlrm_criteo.yaml"


@pytest.fixture(autouse=True)
def at_repo_root(repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)


def reccompile(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("world_size", ["2", "8"])
def test_plan_table(world_size: str, capsys: pytest.CaptureFixture[str], golden) -> None:
    status, out, err = reccompile(capsys, "plan", SPEC, "--world-size", world_size)
    assert (status, err) == (0, "")
    golden.check(f"planner/dlrm_criteo.ws{world_size}.plan.txt", out)


def test_json_and_a_given_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, out, _ = reccompile(capsys, "plan", SPEC, "--world-size", "8", "--json")
    assert status == 0
    plan = ShardingPlan.from_json(out)
    assert plan.world_size == 8 and len(plan.tables) == 26
    assert json.loads(out)["inputs_sha256"] == plan.inputs_sha256
    (tmp_path / "plan.json").write_text(out)
    _, table, _ = reccompile(capsys, "plan", SPEC, "--world-size", "8")
    status, given, err = reccompile(capsys, "plan", SPEC, "--world-size", "8", "--plan", str(tmp_path / "plan.json"))
    assert (status, err, given) == (0, "", table)
    status, again, _ = reccompile(
        capsys, "plan", SPEC, "--world-size", "8", "--plan", str(tmp_path / "plan.json"), "--json"
    )
    assert again == out


def test_topology_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = reccompile(
        capsys, "plan", SPEC, "--world-size", "4", "--ranks-per-host", "2", "--memory-per-rank", "512MiB"
    )
    assert status == 0
    assert out.splitlines()[0] == (
        "plan for dlrm_criteo: 26 tables on 4 ranks on 2 hosts (cpu), 512 MiB per rank, batch 512 per rank"
    )


def test_errors(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = reccompile(capsys, "plan", SPEC, "--memory-per-rank", "lots")
    assert status == 2
    assert "expected a size such as 16GiB" in err
    status, out, err = reccompile(capsys, "plan", SPEC, "--world-size", "2", "--memory-per-rank", "100MiB")
    assert (status, out) == (1, "")
    assert err == (
        "specs/dlrm_criteo.yaml:10:7: error: the tables need at least 671.1 MiB together, "
        "the 2 ranks have 200 MiB (100 MiB each); largest: 'cat_0' 25.8 MiB, 'cat_1' 25.8 MiB, 'cat_2' 25.8 MiB; "
        "8 ranks would fit (--world-size 8)\n"
        "1 error\n"
    )
    status, _, err = reccompile(capsys, "plan", SPEC, "--world-size", "8", "--ranks-per-host", "3")
    assert status == 1
    assert "--ranks-per-host 3 does not divide the world size 8" in err
