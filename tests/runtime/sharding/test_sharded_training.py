"""Two ranks (gloo, CPU) train exactly like one process on the global batch.

One spawned job trains every case (each sharding type, and a mixed plan,
with sgd and rowwise_adagrad) for 10 steps; rank 0 saves the global losses,
the gathered tables and the dense layers. Each test trains the one-process
reference of its case here and compares: losses to a relative 1e-5, tables
and dense layers to an absolute 1e-5. Every case has mean pooling, a
dense-kernel table and a batch feature no table reads; the sgd cases weight
their ids. The job also checks the local state dicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import sharded_cases as sc
import rendezvous

RTOL_LOSS = 1e-5
ATOL_TABLE = 1e-5


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sharded")
    with rendezvous.hosted_store() as port:
        mp.spawn(sc.run_training, args=(port, str(out)), nprocs=sc.WORLD_SIZE)
    return torch.load(Path(out) / "results.pt")


@pytest.mark.parametrize("case", sc.cases(), ids=lambda case: case.name)
def test_two_ranks_train_like_one_process(distributed: dict[str, Any], case: sc.Case) -> None:
    model, tables_of = sc.reference(case)
    losses = sc.train(model, None, rank=0, world_size=1)
    got = distributed[case.name]

    relative = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], losses))
    assert relative <= RTOL_LOSS, f"losses {got['losses']} vs one process {losses}"
    expected = tables_of(model)
    assert sorted(got["tables"]) == sorted(expected)
    for name, table in expected.items():
        torch.testing.assert_close(got["tables"][name], table, rtol=0, atol=ATOL_TABLE)
    for name, tensor in model.mlp.state_dict().items():
        torch.testing.assert_close(got["mlp"][name], tensor, rtol=0, atol=ATOL_TABLE)


def test_column_wise_rowwise_adagrad_is_not_a_whole_table(distributed: dict[str, Any]) -> None:
    """The per-shard accumulator is a real difference, so the split reference above is needed."""
    case = next(c for c in sc.cases() if c.name == "column_wise-rowwise_adagrad")
    model = sc.build(case, None, 1)
    losses = sc.train(model, None, rank=0, world_size=1)
    assert max(abs(a - b) for a, b in zip(distributed[case.name]["losses"], losses)) > 1e-4


def test_local_state_dicts_name_their_shards(distributed: dict[str, Any]) -> None:
    """mixed plan: t0 data_parallel, t1 table_wise on rank 0, t2 column_wise on ranks [1, 0, 0],
    t3 table_row_wise with its one row on rank 0, t4 row_wise [r0: 0-25, r1: 25-50]."""
    rank0, rank1 = distributed["state"]["ranks"]
    t2 = "t2.rows_0_25"
    names0 = ["t0", "t1", f"{t2}.cols_4_8", f"{t2}.cols_8_12", "t3", "t4.rows_0_25.cols_0_4"]
    names1 = ["t0", f"{t2}.cols_0_4", "t4.rows_25_50.cols_0_4"]
    states = ("momentum1", "weight")
    assert rank0["keys"] == [f"{name}.{state}" for name in names0 for state in states]
    assert rank1["keys"] == [f"{name}.{state}" for name in names1 for state in states]
    assert rank1["metadata"]["t4.rows_25_50.cols_0_4"] == {
        "table": "t4",
        "rank": 1,
        "row_offset": 25,
        "rows": 25,
        "col_offset": 0,
        "cols": 4,
        "table_rows": 50,
        "table_cols": 4,
    }
    assert rank0["reload_equal"] and rank1["reload_equal"]
    assert rank0["rank0_only_keys"] == [f"t{i}.weight" for i in range(5)]
    assert rank1["rank0_only_keys"] == []
