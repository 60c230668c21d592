"""Tests of `reccompile check`, `reccompile show` and `reccompile schema` (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler.cli import main
from compiler.spec.validate import load_schema

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def test_check_prints_ok_per_good_spec(capsys) -> None:
    status = main(["check", "specs/dlrm_criteo.yaml", "specs/dcn_criteo.yaml"])
    out, err = capsys.readouterr()
    assert (status, out, err) == (0, "specs/dlrm_criteo.yaml: ok\nspecs/dcn_criteo.yaml: ok\n", "")


def test_check_reports_each_bad_spec_and_still_checks_the_rest(capsys) -> None:
    status = main(["check", "tests/specs/invalid/cycles.yaml", "specs/dlrm_criteo.yaml"])
    out, err = capsys.readouterr()
    assert status == 1
    assert out == "specs/dlrm_criteo.yaml: ok\n"
    assert err.splitlines()[0].startswith("tests/specs/invalid/cycles.yaml:7:25: error: model.a.input: cycle")
    assert err.endswith("2 errors\n")


def test_check_without_a_spec_is_a_usage_error(capsys) -> None:
    assert main(["check"]) == 2
    assert "SPEC" in capsys.readouterr().err


def test_check_of_a_missing_file_is_an_error(capsys) -> None:
    assert main(["check", "no/such.yaml"]) == 1
    expected = "no/such.yaml:1:1: error: cannot read the spec: No such file or directory\n1 error\n"
    assert capsys.readouterr().err == expected


def test_show_prints_the_resolved_spec(capsys) -> None:
    assert main(["show", "specs/dlrm_criteo.yaml"]) == 0
    out = capsys.readouterr().out
    assert "final_activation: none" in out and "width: 415" in out


def test_show_of_a_bad_spec_prints_diagnostics(capsys) -> None:
    assert main(["show", "tests/specs/invalid/head_widths.yaml"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("3 errors\n")


def test_show_needs_exactly_one_spec(capsys) -> None:
    assert main(["show", "specs/dlrm_criteo.yaml", "specs/dcn_criteo.yaml"]) == 2
    capsys.readouterr()


def test_schema_prints_the_json_schema(capsys) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == load_schema()


def test_schema_lists_the_field_stack_blocks_with_their_descriptions(capsys) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    stack_blocks = ["stack", "flatten", "self_attention", "cin", "wukong", "mask_block"]
    assert set(stack_blocks) <= set(schema["$defs"]["block"]["properties"]["type"]["enum"])
    for name in stack_blocks:
        block = schema["$defs"][name]
        assert block["properties"]["type"] == {"const": name, "description": f"`{name}`."}
        assert all(prop.get("description") for prop in block["properties"].values()), name
    assert schema["$defs"]["dense_feature"]["properties"]["embed"]["$ref"] == "#/$defs/numeric_embed"


TOO_BIG = "tests/specs/infeasible/too_big.yaml"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            [],
            "1 rank has 16 GiB; largest: 'user' 95.4 GiB, 'item' 23.8 GiB, 'small' 261 KiB; "
            "8 ranks would fit (--world-size 8)",
        ),
        (
            ["--world-size", "4", "--ranks-per-host", "2"],
            "the 4 ranks have 64 GiB (16 GiB each); largest: 'user' 95.4 GiB, 'item' 23.8 GiB, 'small' 261 KiB; "
            "8 ranks would fit (--world-size 8)",
        ),
        (
            ["--memory-per-rank", "64GiB"],
            "1 rank has 64 GiB; largest: 'user' 95.4 GiB, 'item' 23.8 GiB, "
            "'small' 261 KiB; 2 ranks would fit (--world-size 2)",
        ),
    ],
)
def test_check_plans_and_names_the_tables_bytes_and_world_size_that_would_fit(
    capsys, options: list[str], message: str
) -> None:
    assert main(["check", TOO_BIG, *options]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"{TOO_BIG}:10:7: error: the tables need at least 119.2 GiB together, {message}\n1 error\n"


def test_check_passes_at_the_world_size_it_suggested(capsys) -> None:
    assert main(["check", TOO_BIG, "--world-size", "8"]) == 0
    assert capsys.readouterr().out == f"{TOO_BIG}: ok\n"


def test_check_says_when_no_world_size_would_fit(capsys) -> None:
    spec = "tests/specs/infeasible/pinned_table.yaml"
    assert main(["check", spec]) == 1
    assert capsys.readouterr().err == (
        f"{spec}:7:7: error: the tables need at least 47.7 GiB together, the 2 ranks have 32 GiB (16 GiB each); "
        "largest: 'user' 47.7 GiB; no larger world size that the batch size 256 divides over would fit\n1 error\n"
    )


def test_check_refuses_a_world_size_the_batch_does_not_divide_over(capsys) -> None:
    assert main(["check", TOO_BIG, "--world-size", "3"]) == 1
    assert capsys.readouterr().err == (
        f"{TOO_BIG}:17:1: error: training.batch_size: global batch size 1024 does not divide evenly over 3 ranks\n"
        "1 error\n"
    )
