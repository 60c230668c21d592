"""compiler/planner/enumerate.py: candidates per table, and what constraints do to them."""

from __future__ import annotations

import pytest
from planner_ir import T, make_ir

from compiler.diagnostics import CompileError
from compiler.planner.enumerate import (
    ShardingEnumerator,
    column_splits,
    column_wise_parts,
    row_splits,
    table_specs,
)
from compiler.planner.topology import topology_from_ir


def kinds(ir, **overrides) -> list[tuple[str, str, int, tuple[int, ...] | None]]:
    (table,) = ShardingEnumerator().enumerate(ir, topology_from_ir(ir, **overrides))
    return [(c.sharding_type, c.compute_kernel, len(c.shards), c.ranks) for c in table.candidates]


def test_row_splits_are_ceil_divided_with_a_short_tail() -> None:
    assert row_splits(10, 4) == ((0, 3), (3, 3), (6, 3), (9, 1))
    assert row_splits(9, 4) == ((0, 3), (3, 3), (6, 3), (9, 0))
    assert row_splits(2, 4) == ((0, 1), (1, 1), (2, 0), (2, 0))
    assert sum(n for _, n in row_splits(100_003, 64)) == 100_003


def test_column_splits_are_multiples_of_four() -> None:
    assert column_splits(64, 2) == ((0, 32), (32, 32))
    assert column_splits(100, 3) == ((0, 36), (36, 32), (68, 32))
    assert column_wise_parts(64, 8) == (2, 4, 8)
    assert column_wise_parts(64, 7) == (2, 4)  # one rank per shard
    assert column_wise_parts(8, 64) == (2,)
    assert column_wise_parts(4, 8) == ()
    assert column_wise_parts(10, 8) == ()  # not a multiple of 4
    assert column_wise_parts(64, 1) == (1,)  # world size 1, or one allowed rank


def test_world_size_one_is_table_wise_only() -> None:
    assert kinds(make_ir([T("a", 1000, 16)], world_size=1)) == [("table_wise", "fused", 1, None)]


def test_every_type_on_two_hosts() -> None:
    ir = make_ir([T("a", 1000, 16, optimizer="adagrad")], world_size=4, ranks_per_host=2)
    assert kinds(ir) == [
        ("data_parallel", "fused", 4, (0, 1, 2, 3)),
        ("table_wise", "fused", 1, None),
        ("column_wise", "fused", 2, None),
        ("column_wise", "fused", 4, None),
        ("row_wise", "fused", 4, (0, 1, 2, 3)),
        ("table_row_wise", "fused", 2, (0, 1)),
        ("table_row_wise", "fused", 2, (2, 3)),
    ]


def test_rowwise_adagrad_tables_are_column_wise_only_when_asked() -> None:
    # Each column shard would keep its own per-row accumulator (see ShardingEnumerator).
    ir = make_ir([T("a", 1000, 16)], world_size=4, ranks_per_host=2)  # rowwise_adagrad by default
    assert kinds(ir) == [
        ("data_parallel", "fused", 4, (0, 1, 2, 3)),
        ("table_wise", "fused", 1, None),
        ("row_wise", "fused", 4, (0, 1, 2, 3)),
        ("table_row_wise", "fused", 2, (0, 1)),
        ("table_row_wise", "fused", 2, (2, 3)),
    ]
    asked = make_ir(
        [T("a", 1000, 16)],
        world_size=4,
        ranks_per_host=2,
        constraints={"a": {"sharding_types": ["column_wise", "table_wise"]}},
    )
    assert kinds(asked) == [
        ("table_wise", "fused", 1, None),
        ("column_wise", "fused", 2, None),
        ("column_wise", "fused", 4, None),
    ]
    for optimizer in ("sgd", "adagrad", "adam"):
        other = make_ir([T("a", 1000, 16, optimizer=optimizer)], world_size=4, ranks_per_host=2)
        assert ("column_wise", "fused", 2, None) in kinds(other)


def test_one_host_leaves_out_table_row_wise_unless_asked() -> None:
    assert "table_row_wise" not in {k for k, *_ in kinds(make_ir([T("a", 1000, 16)], world_size=2))}
    ir = make_ir([T("a", 1000, 16)], world_size=2, constraints={"a": {"sharding_types": ["table_row_wise"]}})
    assert kinds(ir) == [("table_row_wise", "fused", 2, (0, 1))]


def test_constraints_narrow_types_kernels_and_ranks() -> None:
    ir = make_ir(
        [T("a", 1000, 16, optimizer="sgd")],
        world_size=4,
        ranks_per_host=2,
        constraints={"a": {"compute_kernels": ["dense", "fused"], "ranks": [2, 3]}},
    )
    assert kinds(ir) == [
        ("table_wise", "dense", 1, None),
        ("column_wise", "dense", 2, None),
        ("table_row_wise", "dense", 2, (2, 3)),
        ("table_wise", "fused", 1, None),
        ("column_wise", "fused", 2, None),
        ("table_row_wise", "fused", 2, (2, 3)),
    ]
    (table,) = ShardingEnumerator().enumerate(ir, topology_from_ir(ir))
    assert table.allowed_ranks == (2, 3)


def test_a_dim_the_fused_kernel_cannot_hold_gets_the_dense_kernel() -> None:
    assert kinds(make_ir([T("a", 1000, 6)], world_size=1)) == [("table_wise", "dense", 1, None)]
    ir = make_ir([T("a", 1000, 6)], world_size=2, constraints={"a": {"compute_kernels": ["fused", "dense"]}})
    assert {kernel for _, kernel, *_ in kinds(ir)} == {"dense"}


def test_a_fused_only_constraint_on_such_a_dim_is_diagnosed() -> None:
    ir = make_ir([T("a", 1000, 6)], world_size=2, constraints={"a": {"compute_kernels": ["fused"]}})
    with pytest.raises(CompileError) as error:
        ShardingEnumerator().enumerate(ir, topology_from_ir(ir))
    assert str(error.value) == (
        "specs/test.yaml:500:3: error: sharding.constraints.a.compute_kernels: table 'a' has dim 6, which "
        "the fused kernel cannot hold (it needs a multiple of 4); allow the dense kernel\n1 error"
    )


def test_table_spec_sums_the_features_of_a_table() -> None:
    ir = make_ir([T("a", 1000, 16, ids=5, features=3, weighted=True, optimizer="adam")])
    (spec,) = table_specs(ir)
    assert (spec.ids_per_sample, spec.outputs_per_sample, spec.weighted, spec.optimizer) == (15, 3, True, "adam")


def test_bad_constraints_are_diagnosed(golden) -> None:
    ir = make_ir(
        [T("a", 1000, 16), T("b", 1000, 6), T("c", 1000, 16)],
        world_size=4,
        constraints={
            "a": {"ranks": [1, 7]},
            "ghost": {"sharding_types": ["row_wise"]},
        },
    )
    with pytest.raises(CompileError) as error:
        ShardingEnumerator().enumerate(ir, topology_from_ir(ir))
    ir = make_ir(
        [T("a", 1000, 16), T("b", 1000, 6)],
        world_size=4,
        constraints={
            "a": {"sharding_types": ["row_wise", "data_parallel"], "ranks": [0, 1]},
            "b": {"sharding_types": ["column_wise"]},
        },
    )
    with pytest.raises(CompileError) as second:
        ShardingEnumerator().enumerate(ir, topology_from_ir(ir))
    golden.check("planner/enumerate_errors.txt", f"{error.value}\n{second.value}\n")


def test_column_wise_at_world_size_one_is_one_shard() -> None:
    ir = make_ir([T("a", 1000, 16)], world_size=1, constraints={"a": {"sharding_types": ["column_wise"]}})
    assert kinds(ir) == [("column_wise", "fused", 1, None)]
