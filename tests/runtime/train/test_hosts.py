"""runtime/train/hosts.py: a plan's table_row_wise tables checked against torchrun's nodes."""

from __future__ import annotations

import pytest

from runtime.train.hosts import check_plan_fits_nodes, ranks_per_node


def plan(*tables: tuple[str, str, list[int]]) -> dict:
    return {
        "tables": [
            {"table": name, "sharding_type": kind, "shards": [{"rank": r} for r in ranks]}
            for name, kind, ranks in tables
        ]
    }


def test_ranks_per_node_is_torchruns_local_world_size() -> None:
    assert ranks_per_node({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert ranks_per_node({}) is None


def test_table_row_wise_within_each_node_passes() -> None:
    check_plan_fits_nodes(
        plan(("a", "table_row_wise", [0, 1]), ("b", "table_row_wise", [2, 3]), ("c", "row_wise", [0, 1, 2, 3])),
        ranks_per_node=2,
    )
    check_plan_fits_nodes(plan(("a", "table_row_wise", [0]), ("b", "table_row_wise", [1])), ranks_per_node=1)


def test_table_row_wise_over_two_nodes_is_refused_naming_the_table() -> None:
    with pytest.raises(ValueError) as error:
        check_plan_fits_nodes(plan(("a", "table_row_wise", [0]), ("b", "table_row_wise", [0, 1])), ranks_per_node=1)
    assert str(error.value) == (
        "plan for table 'b' (table_row_wise): shards on ranks [0, 1] span nodes [0, 1] of 1 rank each "
        "(torchrun's LOCAL_WORLD_SIZE); recompile with --ranks-per-host 1"
    )
