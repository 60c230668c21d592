"""compiler/planner/check.py and plan_file.py: given plans (`--plan FILE`) and their diagnostics."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable

import pytest
from planner_ir import T, make_ir

from compiler.diagnostics import CompileError
from compiler.planner.check import read_plan
from compiler.planner.planner import plan, topology_from_ir
from compiler.planner.topology import MiB

CONSTRAINTS = {
    "rw": {"sharding_types": ["row_wise"]},
    "twrw": {"sharding_types": ["table_row_wise"]},
    "dp": {"sharding_types": ["data_parallel"]},
    "cw": {"sharding_types": ["column_wise"], "ranks": [1, 2, 3]},
    "tw": {"compute_kernels": ["fused"]},
}
IR = make_ir(
    [T("tw", 1000, 16), T("cw", 1000, 64, ids=20), T("rw", 10_000, 16), T("twrw", 10_001, 8), T("dp", 10, 8)],
    world_size=4,
    ranks_per_host=2,
    memory_per_rank=64 * MiB,
    constraints=CONSTRAINTS,
)
TOPOLOGY = topology_from_ir(IR)
PLAN = plan(IR, TOPOLOGY)


def plan_data() -> dict:
    return copy.deepcopy(PLAN.to_dict())


def index(data: dict, name: str) -> int:
    return next(i for i, t in enumerate(data["tables"]) if t["table"] == name)


def test_the_planners_own_plan_reads_back_unchanged(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(PLAN.to_json())
    assert read_plan(tmp_path / "plan.json", IR, TOPOLOGY) == PLAN


def test_a_hand_written_plan_needs_only_the_layout(tmp_path: Path) -> None:
    keep = ("table", "sharding_type", "compute_kernel", "shards")
    data = plan_data()
    minimal = {
        "format_version": 1,
        "world_size": 4,
        "tables": [{k: t[k] for k in keep} for t in data["tables"]],
    }
    (tmp_path / "plan.json").write_text(json.dumps(minimal))
    given = read_plan(tmp_path / "plan.json", IR, TOPOLOGY)
    assert [t.shards for t in given.tables] == [t.shards for t in PLAN.tables]
    assert [t.storage_bytes for t in given.tables] == [t.storage_bytes for t in PLAN.tables]
    assert {t.reason for t in given.tables} == {"given in the plan file"}
    assert given.ranks == PLAN.ranks


def _truncated(data: dict) -> str:
    return json.dumps(data, indent=2)[:300]


def _malformed(data: dict) -> dict:
    data["world_size"] = 0
    data["tables"][0]["shards"][0]["rows"] = "1000"
    del data["tables"][1]["compute_kernel"]
    data["tables"][2]["sharding_type"] = "row_wize"
    data["tables"][3]["shards"] = []
    return data


def _format_version(data: dict) -> dict:
    data["format_version"] = 7
    return data


def _coverage(data: dict) -> dict:
    data["tables"].append(copy.deepcopy(data["tables"][index(data, "tw")]))
    data["tables"][index(data, "dp")]["table"] = "dq"
    del data["tables"][index(data, "rw")]
    return data


def _layout(data: dict) -> dict:
    tw, cw = data["tables"][index(data, "tw")], data["tables"][index(data, "cw")]
    tw["shards"].append(dict(tw["shards"][0], rank=1))
    cw["shards"][0]["cols"] -= 2
    cw["shards"][1]["rank"] = cw["shards"][0]["rank"]
    rw = data["tables"][index(data, "rw")]
    rw["shards"][1]["rows"] += 5
    twrw = data["tables"][index(data, "twrw")]
    twrw["shards"][1]["rank"] = 3
    dp = data["tables"][index(data, "dp")]
    dp["shards"][2]["rank"] = 9
    return data


def _constraints(data: dict) -> dict:
    rw = data["tables"][index(data, "rw")]
    rw.update(
        sharding_type="table_wise", shards=[{"rank": 0, "row_offset": 0, "rows": 10_000, "col_offset": 0, "cols": 16}]
    )
    cw = data["tables"][index(data, "cw")]
    cw["shards"][0]["rank"] = 0
    data["tables"][index(data, "tw")]["compute_kernel"] = "dense"
    return data


def _memory(data: dict) -> dict:
    for table in data["tables"]:
        if table["sharding_type"] in ("table_wise", "column_wise"):
            for shard in table["shards"]:
                shard["rank"] = 1
    cw = data["tables"][index(data, "cw")]
    cw["shards"] = [dict(cw["shards"][0], cols=64, col_offset=0)]
    cw["sharding_type"] = "column_wise"
    return data


def _topology(data: dict) -> dict:
    data["world_size"] = 8
    data["device"] = "cuda"
    return data


CASES: dict[str, Callable[[dict], object]] = {
    "invalid_json": _truncated,
    "malformed": _malformed,
    "format_version": _format_version,
    "coverage": _coverage,
    "layout": _layout,
    "constraints": _constraints,
    "memory": _memory,
    "topology": _topology,
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_plans_are_diagnosed(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, golden) -> None:
    changed = CASES[case](plan_data())
    text = changed if isinstance(changed, str) else json.dumps(changed, indent=2, sort_keys=True) + "\n"
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(text)
    memory = 2 * MiB if case == "memory" else None
    topology = topology_from_ir(IR, memory_per_rank=memory)
    with pytest.raises(CompileError) as error:
        read_plan("plan.json", IR, topology)
    golden.check(f"planner/check_{case}.txt", str(error.value) + "\n")


def test_a_fused_kernel_for_a_dim_it_cannot_hold_is_a_diagnostic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ir = make_ir([T("odd", 100, 6)], world_size=1)
    topology = topology_from_ir(ir)
    data = plan(ir, topology).to_dict()
    assert data["tables"][0]["compute_kernel"] == "dense"  # the planner's own choice
    data["tables"][0]["compute_kernel"] = "fused"
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(json.dumps(data, indent=2) + "\n")
    with pytest.raises(CompileError) as error:
        read_plan("plan.json", ir, topology)
    assert (
        str(error.value)
        .splitlines()[0]
        .endswith(
            "error: tables[0].compute_kernel: the fused kernel needs a dim that is a multiple of 4, "
            "'odd' has 6; use the dense kernel"
        )
    )


def test_a_missing_file_is_a_diagnostic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CompileError) as error:
        read_plan("nowhere.json", IR, TOPOLOGY)
    assert str(error.value) == "nowhere.json:1:1: error: cannot read the plan: No such file or directory\n1 error"


@pytest.mark.parametrize(
    ("optimizer", "constraints", "refused"),
    [
        ("rowwise_adagrad", None, True),
        ("adagrad", None, False),
        ("rowwise_adagrad", {"t": {"sharding_types": ["column_wise"]}}, False),
    ],
)
def test_column_wise_shards_of_a_rowwise_adagrad_table_need_the_specs_consent(
    optimizer: str, constraints: dict | None, refused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard would keep its own per-row accumulator: not what one process trains."""
    monkeypatch.chdir(tmp_path)
    ir = make_ir([T("t", 100, 16, optimizer=optimizer)], world_size=2, constraints=constraints)
    topology = topology_from_ir(ir)
    data = plan(ir, topology).to_dict()
    halves = [{"rank": r, "row_offset": 0, "rows": 100, "col_offset": 8 * r, "cols": 8} for r in (0, 1)]
    data["tables"][0].update(sharding_type="column_wise", shards=halves)
    Path("plan.json").write_text(json.dumps(data, indent=2) + "\n")
    if not refused:
        assert read_plan("plan.json", ir, topology).tables[0].sharding_type == "column_wise"
        return
    with pytest.raises(CompileError) as error:
        read_plan("plan.json", ir, topology)
    assert (
        str(error.value)
        .splitlines()[0]
        .endswith(
            "error: tables[0].sharding_type: column_wise shards of 't' would each keep their own rowwise_adagrad "
            "accumulator, so the ranks would not train what one process trains; the spec's constraints must ask "
            "for column_wise (sharding_types) to allow it"
        )
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format_version": 1,\n "cost_ms": NaN}', "plan.json:2:13: error: invalid JSON: NaN is not a JSON number"),
        ('{"x": [1, -Infinity]}', "plan.json:1:11: error: invalid JSON: -Infinity is not a JSON number"),
        (
            '{"world_size": ' + "9" * 5000 + "}",
            "plan.json:1:1: error: invalid JSON: Exceeds the limit (4300 digits) "
            "for integer string conversion: value has 5000 digits",
        ),
        ("[" * 100_000 + "]" * 100_000, "plan.json:1:1: error: invalid JSON: nested too deeply"),
        (
            '{"format_version": true, "world_size": 1, "tables": []}',
            "plan.json:1:20: error: format_version: unsupported format_version true (this compiler reads 1)",
        ),
        (
            '{"format_version": 1.0, "world_size": 1, "tables": []}',
            "plan.json:1:20: error: format_version: unsupported format_version 1.0 (this compiler reads 1)",
        ),
    ],
)
def test_what_pythons_json_reads_beyond_json_is_a_diagnostic(
    text: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(text)
    with pytest.raises(CompileError) as error:
        read_plan("plan.json", IR, TOPOLOGY)
    assert str(error.value).splitlines()[0] == message
