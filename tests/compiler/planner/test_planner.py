"""compiler/planner/planner.py (with partition.py): the plans it makes and why."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_ir import T, dlrm_ir, make_ir

from compiler.diagnostics import CompileError
from compiler.planner.check import check_plan
from compiler.planner.partition import Placement
from compiler.planner.plan import ShardingPlan
from compiler.planner.planner import Planner, inputs_sha256, plan, topology_from_ir
from compiler.planner.report import format_plan
from compiler.planner.topology import GiB, MiB

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from planner_bench import bench_ir  # noqa: E402


def make_plan(ir, **overrides) -> ShardingPlan:
    topology = topology_from_ir(ir, **overrides)
    result = plan(ir, topology)
    check_plan(ir, topology, result)  # every plan the planner makes passes the plan checker
    return result


def slowest_over_bound(result: ShardingPlan) -> float:
    return max(r.cost_ms for r in result.ranks) / result.lower_bound_ms


def test_world_size_one_is_all_table_wise_on_rank_zero() -> None:
    result = make_plan(dlrm_ir(1))
    assert {(t.sharding_type, t.compute_kernel, t.shards[0].rank) for t in result.tables} == {
        ("table_wise", "fused", 0)
    }
    assert result.tables[0].reason == "table_wise: world size 1"


def test_a_table_larger_than_one_rank_is_row_wise() -> None:
    ir = make_ir([T("big", 5_000_000, 64, ids=20), T("small", 10_000, 16)], world_size=2, memory_per_rank=GiB)
    big = make_plan(ir).table("big")
    assert big.sharding_type == "row_wise"
    assert big.reason == "row_wise: 1.2 GiB as table_wise does not fit one rank (1 GiB)"
    assert [(s.rank, s.row_offset, s.rows) for s in big.shards] == [(0, 0, 2_500_000), (1, 2_500_000, 2_500_000)]


def test_tables_larger_than_one_rank_are_table_row_wise_across_hosts() -> None:
    tables = [T("big_a", 5_000_000, 64, ids=20), T("big_b", 5_000_000, 64, ids=20)]
    result = make_plan(make_ir(tables, world_size=4, ranks_per_host=2, memory_per_rank=GiB))
    assert [(t.sharding_type, [s.rank for s in t.shards]) for t in result.tables] == [
        ("table_row_wise", [0, 1]),
        ("table_row_wise", [2, 3]),
    ]


def test_a_hot_table_of_one_id_features_is_data_parallel_when_allowed() -> None:
    """Every replica looks up the global batch, so data_parallel never has the least
    total time; it spreads a table too slow for one rank, and beats row_wise where
    the pooled output outweighs the ids: it sends the pooled gradients only once."""
    tables = [T("hot", 1000, 64, features=8), T("item", 100_000, 64)]
    result = make_plan(make_ir(tables, world_size=2))
    hot = result.table("hot")
    assert hot.sharding_type == "data_parallel"
    assert [s.rank for s in hot.shards] == [0, 1]
    assert hot.reason == "data_parallel: balances ranks: as table_wise it left rank 0 the slowest (0.784 ms)"
    for others in (["table_wise", "row_wise"], ["table_wise"]):
        constrained = make_plan(make_ir(tables, world_size=2, constraints={"hot": {"sharding_types": others}}))
        assert constrained.table("hot").sharding_type != "data_parallel"
        assert max(r.cost_ms for r in constrained.ranks) > max(r.cost_ms for r in result.ranks)


def test_a_tiny_table_with_many_ids_per_sample_is_row_wise_not_data_parallel() -> None:
    """Many ids per pooled vector: splitting the ids beats every rank looking all of them up."""
    tables = [T("tiny", 100, 16, ids=50), *(T(f"t{i}", 100_000, 64) for i in range(4))]
    result = make_plan(make_ir(tables, world_size=2))
    assert result.table("tiny").sharding_type == "row_wise"
    assert {result.table(f"t{i}").sharding_type for i in range(4)} == {"table_wise"}
    assert slowest_over_bound(result) < 1.05


def test_a_wide_table_among_few_ranks_is_column_wise_when_that_balances() -> None:
    ir = make_ir([T("wide", 200_000, 256, ids=10, optimizer="adagrad"), T("small", 1000, 16)], world_size=2)
    result = make_plan(ir)
    wide = result.table("wide")
    assert wide.sharding_type == "column_wise"
    assert sorted(s.rank for s in wide.shards) == [0, 1]
    assert all(s.cols % 4 == 0 for s in wide.shards)
    table_wise_only = make_plan(replace(ir, sharding=replace(ir.sharding, constraints=())), world_size=1)
    assert max(r.cost_ms for r in result.ranks) < 0.6 * table_wise_only.ranks[0].cost_ms
    assert slowest_over_bound(result) < 1.05


def test_constraints_are_respected() -> None:
    constraints = {
        "cat_0": {"sharding_types": ["row_wise"]},
        "cat_1": {"compute_kernels": ["dense"]},
        "cat_2": {"ranks": [3]},
        "cat_3": {"sharding_types": ["column_wise", "table_wise"], "ranks": [1, 2]},
    }
    ir = make_ir([T(f"cat_{i}", 100_000, 64) for i in range(8)], world_size=4, constraints=constraints)
    result = make_plan(ir)
    assert result.table("cat_0").sharding_type == "row_wise"
    assert result.table("cat_0").reason == "row_wise: the only option the spec's constraints allow"
    assert result.table("cat_1").compute_kernel == "dense"
    assert {s.rank for s in result.table("cat_2").shards} == {3}
    assert result.table("cat_3").sharding_type in ("column_wise", "table_wise")
    assert {s.rank for s in result.table("cat_3").shards} <= {1, 2}


def test_same_input_same_plan_and_hash() -> None:
    ir = make_ir([T(f"t{i}", 10 ** (3 + i % 4), 16 * (1 + i % 3), ids=1 + i % 7) for i in range(40)], world_size=8)
    first, second = make_plan(ir), make_plan(ir)
    assert first.to_json() == second.to_json()
    assert first.inputs_sha256 == inputs_sha256(ir, topology_from_ir(ir))
    bigger_batch = replace(ir, training=replace(ir.training, batch_size=4096))
    assert make_plan(bigger_batch).inputs_sha256 != first.inputs_sha256
    assert make_plan(ir, memory_per_rank=GiB).inputs_sha256 != first.inputs_sha256


def test_json_round_trip() -> None:
    result = make_plan(make_ir([T("tiny", 100, 16, ids=50), T("wide", 200_000, 256, ids=10)], world_size=4))
    assert ShardingPlan.from_json(result.to_json()) == result
    data = result.to_dict()
    assert data["format_version"] == 1
    assert isinstance(data["tables"][0]["shards"], list)


def test_infeasible_models_are_diagnosed(golden) -> None:
    texts = []
    cases = [
        # all tables together need more than all ranks have
        (make_ir([T(f"t{i}", 4_000_000, 64) for i in range(3)], world_size=2, memory_per_rank=GiB), {}),
        # one table that no allowed sharding fits
        (
            make_ir(
                [T("big", 4_000_000, 4, ids=20)],
                world_size=4,
                memory_per_rank=64 * MiB,
                constraints={"big": {"sharding_types": ["table_wise"]}},
            ),
            {},
        ),
        # room enough in all, but not on the one rank the table may use
        (
            make_ir(
                [T("big", 3_000_000, 16, ids=20), T("other", 100, 16)],
                world_size=2,
                memory_per_rank=128 * MiB,
                constraints={"big": {"ranks": [0]}},
            ),
            {},
        ),
        # each table fits a rank, and all fit all ranks, but they do not pack
        (
            make_ir(
                [T(f"t{i}", 3_000_000, 4) for i in range(3)],
                world_size=2,
                memory_per_rank=100 * MiB,
                constraints={f"t{i}": {"sharding_types": ["table_wise"]} for i in range(3)},
            ),
            {},
        ),
    ]
    for ir, overrides in cases:
        with pytest.raises(CompileError) as error:
            make_plan(ir, **overrides)
        texts.append(str(error.value))
    golden.check("planner/infeasible.txt", "\n".join(texts) + "\n")


class RoundRobin:
    """A stand-in partitioner: the first table_wise option, free shards dealt out in turn."""

    def partition(self, tables, topology):
        placements, rank = [], 0
        for table in tables:
            choice = next(i for i, o in enumerate(table.options) if o.candidate.sharding_type == "table_wise")
            candidate = table.options[choice].candidate
            ranks = candidate.ranks or tuple((rank + j) % topology.world_size for j in range(len(candidate.shards)))
            rank = (rank + len(candidate.shards)) % topology.world_size
            placements.append(Placement(choice, ranks, "round robin"))
        return tuple(placements)


def test_stages_are_swappable() -> None:
    ir = dlrm_ir(4)
    topology = topology_from_ir(ir)
    result = Planner(partitioner=RoundRobin()).plan(ir, topology)
    assert [t.shards[0].rank for t in result.tables[:5]] == [0, 1, 2, 3, 0]
    assert {t.reason for t in result.tables} == {"round robin"}
    check_plan(ir, topology, result)


def mixed_ir():
    """Every sharding type, each where it is the planner's answer (or the spec's, for `hashed`)."""
    tables = [
        T("big_a", 5_000_000, 64, ids=20),
        T("big_b", 5_000_000, 64, ids=20),
        T("hot", 1000, 64, features=8),
        T("wide", 400_000, 256, ids=20, optimizer="adagrad"),
        *(T(f"mid_{i}", 200_000, 32, ids=2) for i in range(6)),
        T("hashed", 2_000_000, 16, ids=4),
    ]
    constraints = {"hashed": {"sharding_types": ["row_wise"]}}
    return make_ir(tables, world_size=4, ranks_per_host=2, memory_per_rank=GiB, constraints=constraints)


def test_report_of_a_plan_with_every_sharding_type(golden) -> None:
    ir = mixed_ir()
    topology = topology_from_ir(ir)
    result = make_plan(ir)
    assert {t.sharding_type for t in result.tables} == {
        "table_wise",
        "column_wise",
        "row_wise",
        "table_row_wise",
        "data_parallel",
    }
    golden.check("planner/report_mixed.txt", format_plan(ir, topology, result))


@pytest.mark.parametrize("ranks", [8, 16])
def test_planner_bench_recipe_is_balanced(ranks: int) -> None:
    """A fifth of planner-bench: the slowest rank within 10% of the lower bound."""
    result = make_plan(bench_ir(200, ranks), memory_per_rank=1 << 40)
    assert slowest_over_bound(result) < 1.10


table_strategy = st.builds(
    lambda rows, dim, ids, features, optimizer: (rows, dim, ids, features, optimizer),
    st.integers(1, 3_000_000),
    st.sampled_from([4, 8, 12, 16, 64, 100, 128]),
    st.integers(0, 40),
    st.integers(1, 3),
    st.sampled_from(["sgd", "rowwise_adagrad", "adagrad", "adam"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tables=st.lists(table_strategy, min_size=1, max_size=10),
    hosts=st.integers(1, 3),
    per_host=st.integers(1, 4),
    memory_mib=st.integers(16, 4096),
    device=st.sampled_from(["cpu", "cuda"]),
    batch=st.integers(1, 4096),
)
def test_plans_never_exceed_memory_and_always_pass_the_checker(
    tables, hosts: int, per_host: int, memory_mib: int, device: str, batch: int
) -> None:
    specs = [
        T(f"t{i}", rows, dim, ids, features, optimizer=opt) for i, (rows, dim, ids, features, opt) in enumerate(tables)
    ]
    ir = make_ir(specs, world_size=hosts * per_host, ranks_per_host=per_host, device=device, batch_size=batch)
    topology = topology_from_ir(ir, memory_per_rank=memory_mib * MiB)
    try:
        result = plan(ir, topology)
    except CompileError as error:
        assert all("does not fit" in d.message or "need at least" in d.message for d in error.diagnostics)
        return
    check_plan(ir, topology, result)
    assert all(r.bytes_used <= r.bytes_available == memory_mib * MiB for r in result.ranks)
    assert [t.table for t in result.tables] == [t.name for t in specs]
    assert max(r.cost_ms for r in result.ranks) >= result.lower_bound_ms * (1 - 1e-6)
