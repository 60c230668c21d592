"""Reading the plan (runtime/sharding/layout.py): checks, slot order, shard names."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import sharded_cases as sc
import torch

from runtime.config.embeddings import EmbeddingOptimizer
from runtime.sharding import table_row_wise
from runtime.sharding.group import GroupEnv
from runtime.sharding.layout import Shard, TableLayout, local_tables, slots_by_rank, table_layouts


def plan_error(edit: Callable[[dict[str, dict[str, Any]]], None]) -> str:
    """The error of reading the MIXED plan after `edit` changed its entries (by table)."""
    plan = sc.make_plan(sc.MIXED)
    edit({entry["table"]: entry for entry in plan["tables"]})
    with pytest.raises(ValueError) as raised:
        table_layouts(sc.TABLES, plan, sc.WORLD_SIZE)
    return str(raised.value)


def test_plan_errors_name_the_table() -> None:
    def unknown(t: dict[str, Any]) -> None:
        t["t1"]["sharding_type"] = "diagonal"

    def far_rank(t: dict[str, Any]) -> None:
        t["t1"]["shards"][0]["rank"] = 5

    def gap(t: dict[str, Any]) -> None:
        t["t3"]["shards"] = [sc.shard(0, (0, 0), (0, 4))]

    def missing_replica(t: dict[str, Any]) -> None:
        t["t0"]["shards"] = t["t0"]["shards"][:1]

    def partial_rows(t: dict[str, Any]) -> None:
        t["t2"]["shards"][0]["rows"] = 10

    assert plan_error(unknown) == (
        "plan for table 't1' (diagonal): unknown sharding type; expected one of data_parallel, "
        "table_wise, column_wise, row_wise, table_row_wise"
    )
    assert plan_error(far_rank) == ("plan for table 't1' (table_wise): shard on rank 5 but the plan has 2 ranks")
    assert plan_error(gap) == "plan for table 't3' (table_row_wise): shards cover rows 0..0 of 1"
    assert plan_error(missing_replica) == (
        "plan for table 't0' (data_parallel): needs one whole replica on each of the 2 ranks"
    )
    assert plan_error(partial_rows) == ("plan for table 't2' (column_wise): every shard must hold all 25 rows")
    plan = sc.make_plan(sc.MIXED)
    plan["tables"].pop()
    with pytest.raises(ValueError, match="^the plan has no entry for table\\(s\\) t4$"):
        table_layouts(sc.TABLES, plan, sc.WORLD_SIZE)


def test_slots_follow_kernel_table_shard_feature_order() -> None:
    """column_wise: t2's three column shards sit on ranks [1, 0, 0]; t3 and t4 (dense kernel,
    so last) are whole on rank 1."""
    layouts = table_layouts(sc.TABLES, sc.make_plan({t.name: "column_wise" for t in sc.TABLES}), 2)
    rank0, rank1 = ([slot.name for slot in slots] for slots in slots_by_rank(layouts, 2))
    assert rank0 == [
        "f0@t0.rows_0_40.cols_0_4",
        "f1@t0.rows_0_40.cols_0_4",
        "f2@t1.rows_0_30.cols_0_4",
        "f3@t2.rows_0_25.cols_4_8",
        "f3@t2.rows_0_25.cols_8_12",
    ]
    assert rank1 == [
        "f0@t0.rows_0_40.cols_4_8",
        "f1@t0.rows_0_40.cols_4_8",
        "f2@t1.rows_0_30.cols_4_8",
        "f3@t2.rows_0_25.cols_0_4",
        "f4",
        "f5",
    ]


def test_row_sharded_shards_pool_by_sum_and_empty_ones_are_not_built() -> None:
    layouts = table_layouts(sc.TABLES, sc.make_plan({t.name: "row_wise" for t in sc.TABLES}), 2)
    rank1 = {t.config.name: t.config for t in local_tables(layouts, 1)}
    assert "t3" not in " ".join(rank1)  # one row: rank 1's range is empty
    assert rank1["t1.rows_15_30.cols_0_8"].pooling == "sum"  # t1 pools by mean
    assert rank1["t1.rows_15_30.cols_0_8"].init_range() == sc.TABLES[1].init_range()


def test_table_row_wise_tables_stay_on_one_host() -> None:
    """Four ranks: t0 on ranks 0-1 makes hosts of 2 ranks, so t1 on ranks 1-2 spans two."""
    t0, t1 = sc.TABLES[:2]
    layouts = [
        TableLayout(t0, "table_row_wise", "fused", (Shard(0, 0, 20, 0, 8), Shard(1, 20, 20, 0, 8))),
        TableLayout(t1, "table_row_wise", "fused", (Shard(1, 0, 15, 0, 8), Shard(2, 15, 15, 0, 8))),
    ]
    env = GroupEnv(0, 4, None, torch.device("cpu"), EmbeddingOptimizer(), False)
    with pytest.raises(ValueError) as raised:
        table_row_wise.build(layouts, env)
    assert str(raised.value) == (
        "plan for table 't1' (table_row_wise): shards on ranks [1, 2] span several hosts of 2 ranks"
    )
