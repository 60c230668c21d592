"""compiler/planner/estimate.py: the storage and cost formulas of docs/planner.md."""

from __future__ import annotations

import pytest
from planner_ir import T, dlrm_ir, make_ir

from compiler.planner.enumerate import table_specs
from compiler.planner.estimate import estimate_shard, state_bytes_per_row
from compiler.planner.topology import GiB, topology_from_ir


@pytest.mark.parametrize(
    "optimizer, per_row", [("sgd", 0), ("rowwise_adagrad", 4), ("adagrad", 64 * 4), ("adam", 2 * 64 * 4)]
)
def test_optimizer_state(optimizer: str, per_row: int) -> None:
    assert state_bytes_per_row(optimizer, 64) == per_row  # type: ignore[arg-type]
    ir = make_ir([T("a", 1000, 64, optimizer=optimizer)], world_size=1, batch_size=1)
    spec, topology = table_specs(ir)[0], topology_from_ir(ir)
    estimate = estimate_shard(spec, "table_wise", "fused", 1000, 64, topology)
    buffers = 1 * 8 + 2 * 1 * 64 * 4  # one id in, one pooled vector out and its gradient
    assert estimate.storage_bytes == 1000 * 64 * 4 + 1000 * per_row + buffers
    assert estimate.input_dist_ms == estimate.output_dist_ms == 0.0  # one rank: nothing leaves it


def test_worked_example_of_the_docs() -> None:
    """docs/planner.md, "Worked example": cat_0 of DLRM at world size 2 on cpu."""
    ir = dlrm_ir(2)
    spec, topology = table_specs(ir)[0], topology_from_ir(ir)
    tw = estimate_shard(spec, "table_wise", "fused", 100_000, 64, topology)
    assert tw.storage_bytes == 27_064_960
    assert tw.lookup_ms == pytest.approx(2_654_208 / (51 * GiB) * 1000)
    assert tw.input_dist_ms == pytest.approx(16_384 * 0.5 / (10 * GiB) * 1000)  # rank 1's half of the ids
    assert tw.output_dist_ms == pytest.approx(2 * 524_288 * 0.5 / (10 * GiB) * 1000)
    assert round(tw.cost_ms, 4) == 0.0981
    rw = estimate_shard(spec, "row_wise", "fused", 50_000, 64, topology)
    assert rw.storage_bytes == 50_000 * 260 + 1024 * 8 + 2 * 524_288
    assert rw.output_dist_ms == pytest.approx(tw.output_dist_ms)  # reduce-scatter sends (W-1)/W, as the all-to-all
    assert round(2 * rw.cost_ms, 4) == 0.1660


def test_data_parallel_looks_up_the_global_batch_and_gathers_gradients() -> None:
    """runtime/sharding/data_parallel.py: each replica pools the all-gathered global
    batch and applies the all-gathered pooled gradients itself, fused; no dense
    gradient, no sweep over the table, no all-reduce."""
    ir = dlrm_ir(2)
    spec, topology = table_specs(ir)[0], topology_from_ir(ir)
    tw = estimate_shard(spec, "table_wise", "fused", 100_000, 64, topology)
    dp = estimate_shard(spec, "data_parallel", "fused", 100_000, 64, topology)
    # weights + row-wise state + 2048 ids in + 2048 pooled vectors out and their gradient
    assert dp.storage_bytes == 100_000 * (256 + 4) + 2048 * 8 + 2 * 2048 * 256 == tw.storage_bytes
    forward = 2048 * (8 + 256) + 2048 * 256  # read ids and rows, write pooled
    backward = 2048 * 256 + 2048 * 2 * (256 + 4)  # read pooled gradient, update touched rows + state
    assert dp.lookup_ms == pytest.approx((forward + backward) / (51 * GiB) * 1000)
    assert dp.input_dist_ms == pytest.approx(1024 * 8 / (10 * GiB) * 1000)  # the other rank's ids
    assert dp.output_dist_ms == pytest.approx(1024 * 256 / (10 * GiB) * 1000)  # its pooled gradients, backward only
    assert round(dp.cost_ms, 4) == 0.0736
    assert 2 * dp.cost_ms > tw.cost_ms  # two lookups of the global batch cost more than one
    eight = topology_from_ir(dlrm_ir(8))
    dp8 = estimate_shard(spec, "data_parallel", "fused", 100_000, 64, eight)
    assert dp8.lookup_ms == pytest.approx(dp.lookup_ms)  # the global batch is 2048 samples either way
    assert dp8.output_dist_ms == pytest.approx(7 * 256 * 256 / (10 * GiB) * 1000)


def test_kernels_and_weighted_features() -> None:
    ir = make_ir([T("a", 1000, 64, ids=10, weighted=True)], world_size=2, device="cuda")
    spec, topology = table_specs(ir)[0], topology_from_ir(ir)
    fused = estimate_shard(spec, "table_wise", "fused", 1000, 64, topology)
    dense = estimate_shard(spec, "table_wise", "dense", 1000, 64, topology)
    assert dense.lookup_ms == pytest.approx(2 * fused.lookup_ms)
    assert dense.storage_bytes == fused.storage_bytes + 1000 * 64 * 4  # a dense gradient
    ids_in = 1024 * 10 * (8 + 4)  # the other rank's batch x ids, each an int64 and a float weight
    assert fused.input_dist_ms == pytest.approx(ids_in / topology.comm_bandwidth * 1000)


def test_table_row_wise_reduces_inside_the_host_first() -> None:
    ir = make_ir([T("a", 100_000, 64, ids=8)], world_size=8, ranks_per_host=4)
    spec, topology = table_specs(ir)[0], topology_from_ir(ir)
    rw = estimate_shard(spec, "row_wise", "fused", 12_500, 64, topology)
    twrw = estimate_shard(spec, "table_row_wise", "fused", 25_000, 64, topology)
    assert twrw.output_dist_ms < rw.output_dist_ms
