"""The planner and sequence tables: L·B·D outputs, no table_row_wise, and what it then chooses.

A table serving a sequence feature (max_length L) returns one row per id,
so its output per sample is L rows, not one pooled vector (enumerate.py's
TableSpec, estimate.py's traffic); the runtime does not build
table_row_wise for such tables, so the planner never offers it and a
constraint or a given plan asking for it is a diagnostic naming the table.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from planner_ir import T, make_ir

from compiler.diagnostics import CompileError
from compiler.pipeline import compile_spec
from compiler.planner.check import read_plan
from compiler.planner.enumerate import ShardingEnumerator, table_specs
from compiler.planner.estimate import estimate_shard
from compiler.planner.planner import inputs_sha256, plan, topology_from_ir
from compiler.planner.topology import GiB

ROW_BYTES = 64 * 4


def with_sequence(ir, feature: str, max_length: int):
    """`ir` with `feature` made a sequence of up to `max_length` ids."""
    sparse = tuple(dataclasses.replace(f, max_length=max_length) if f.name == feature else f for f in ir.sparse)
    return dataclasses.replace(ir, sparse=sparse)


def test_a_sequence_table_outputs_one_row_per_id_its_pooled_features_too() -> None:
    ir = with_sequence(make_ir([T("items", 1000, 64, features=2), T("user", 100, 8)]), "items_f1", 50)
    items, user = table_specs(ir)
    assert (items.ids_per_sample, items.outputs_per_sample, items.sequence_features) == (51, 51, ("items_f1",))
    assert (user.ids_per_sample, user.outputs_per_sample, user.is_sequence) == (1, 1, False)


def test_sequence_outputs_cost_l_b_d() -> None:
    """Batch 2048 over 2 ranks, L = 50, dim 64: 102,400 rows of 256 bytes out, 50x a pooled table's."""
    pooled_ir = make_ir([T("hist", 1000, 64)])
    sequence_ir = make_ir([T("hist", 1000, 64, max_length=50)])
    topology = topology_from_ir(sequence_ir)
    pooled = estimate_shard(table_specs(pooled_ir)[0], "table_wise", "fused", 1000, 64, topology)
    tw = estimate_shard(table_specs(sequence_ir)[0], "table_wise", "fused", 1000, 64, topology)
    out = 2048 * 50 * ROW_BYTES
    assert tw.output_dist_ms == pytest.approx(2 * out * 0.5 / (10 * GiB) * 1000)
    assert tw.output_dist_ms == pytest.approx(50 * pooled.output_dist_ms)
    ids = 2048 * 50
    assert tw.storage_bytes == 1000 * (ROW_BYTES + 4) + ids * 8 + 2 * out  # rowwise_adagrad state: 4 per row
    forward = ids * (8 + ROW_BYTES) + out
    backward = out + ids * 2 * (ROW_BYTES + 4)
    assert tw.lookup_ms == pytest.approx((forward + backward) / (51 * GiB) * 1000)
    # A row split returns only the rows it holds: no partial sums for every sample.
    rw = estimate_shard(table_specs(sequence_ir)[0], "row_wise", "fused", 500, 64, topology)
    assert rw.output_dist_ms == pytest.approx(tw.output_dist_ms / 2)
    assert rw.lookup_ms == pytest.approx(tw.lookup_ms / 2)
    dp = estimate_shard(table_specs(sequence_ir)[0], "data_parallel", "fused", 1000, 64, topology)
    assert dp.output_dist_ms == pytest.approx(out * 0.5 / (10 * GiB) * 1000)  # gradients back only


def test_a_table_data_parallel_when_pooled_is_row_wise_as_a_sequence() -> None:
    """One id per sample: the cheapest is a replica per rank. Fifty rows per sample: every
    replica would look all of them up, so the rows are split among the ranks instead."""
    for max_length, expected in ((None, "data_parallel"), (50, "row_wise")):
        ir = make_ir([T("hist", 1000, 64, max_length=max_length)])
        (table,) = plan(ir, topology_from_ir(ir)).tables
        assert table.sharding_type == expected


def test_table_row_wise_is_never_offered_for_a_sequence_table() -> None:
    ir = make_ir([T("hist", 100_000, 64, max_length=20), T("cat", 100_000, 64)], world_size=4, ranks_per_host=2)
    hist, cat = ShardingEnumerator().enumerate(ir, topology_from_ir(ir))
    assert "table_row_wise" in {c.sharding_type for c in cat.candidates}
    assert {c.sharding_type for c in hist.candidates} == {"data_parallel", "table_wise", "row_wise"}


def test_a_constraint_asking_table_row_wise_for_a_sequence_table_is_a_diagnostic() -> None:
    ir = make_ir(
        [T("hist", 1000, 64, max_length=20)],
        world_size=4,
        ranks_per_host=2,
        constraints={"hist": {"sharding_types": ["table_row_wise", "row_wise"]}},
    )
    with pytest.raises(CompileError) as error:
        plan(ir, topology_from_ir(ir))
    assert str(error.value) == (
        "specs/test.yaml:500:3: error: sharding.constraints.hist.sharding_types: table 'hist' serves "
        "hist, looked up row by row (a sequence or position-weighted feature), and such tables cannot be "
        "table_row_wise; use row_wise, table_wise, column_wise or data_parallel\n1 error"
    )


def test_a_given_plan_with_a_table_row_wise_sequence_table_is_a_diagnostic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pooled = make_ir(
        [T("hist", 1000, 64)],
        world_size=4,
        ranks_per_host=2,
        constraints={"hist": {"sharding_types": ["table_row_wise"]}},
    )
    data = plan(pooled, topology_from_ir(pooled)).to_dict()
    sequence = make_ir([T("hist", 1000, 64, max_length=20)], world_size=4, ranks_per_host=2)
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(json.dumps(data, indent=2) + "\n")
    with pytest.raises(CompileError) as error:
        read_plan("plan.json", sequence, topology_from_ir(sequence))
    (line,) = [x for x in str(error.value).splitlines() if "error:" in x]
    assert line.endswith(
        "error: tables[0].sharding_type: table 'hist' serves hist, looked up row by row (a sequence or "
        "position-weighted feature), and such tables cannot be table_row_wise; use row_wise, table_wise, "
        "column_wise or data_parallel"
    )


def test_max_length_is_an_input_of_the_plan() -> None:
    short, long = (make_ir([T("hist", 1000, 64, max_length=n)]) for n in (20, 50))
    pooled = make_ir([T("hist", 1000, 64)])
    hashes = {inputs_sha256(ir, topology_from_ir(ir)) for ir in (short, long, pooled)}
    assert len(hashes) == 3


POSITION_WEIGHTED = """\
version: 1
name: pw
features:
  sparse:
    - {name: a, num_embeddings: 100, dim: 8, max_ids_per_sample: 3, position_weights: true}
model:
  top: {type: mlp, input: sparse.a, layers: [1]}
heads:
  - {name: click, input: top, loss: bce}
training: {batch_size: 8}
sharding:
  world_size: 4
  ranks_per_host: 2
  constraints:
    a: {sharding_types: [table_row_wise]}
"""


def test_a_position_weighted_table_is_named_for_what_it_is(tmp_path: Path) -> None:
    """Its ids are looked up as rows, like a sequence's, though the feature is pooled."""
    path = tmp_path / "pw.yaml"
    path.write_text(POSITION_WEIGHTED)
    with pytest.raises(CompileError) as error:
        compile_spec(str(path))
    assert str(error.value) == (
        f"{path}:15:5: error: sharding.constraints.a.sharding_types: table 'a' serves a, looked up row by row "
        "(a sequence or position-weighted feature), and such tables cannot be table_row_wise; use row_wise, "
        "table_wise, column_wise or data_parallel\n1 error"
    )
