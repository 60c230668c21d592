"""Two ranks (gloo, CPU) train sequence tables exactly like one process on the global batch.

One spawned job trains every case of sequence_cases (each sequence sharding
type and a mixed plan, with sgd and rowwise_adagrad, and the mixed plan with
Adam on the dense kernel) for 6 steps; rank 0 saves the global losses, the
gathered tables and the dense parameters. Each test trains the one-process
reference of its case here and compares: losses to a relative 1e-5, tables
and dense parameters to an absolute 1e-5. Every case has empty sequences, a
feature empty on a whole rank, a step where one rank has no sequence ids,
a table serving two sequence features, tables of three widths, a dense-kernel
table and a bag table beside the sequence tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import sequence_cases as qc
import sharded_cases as sc
import rendezvous

RTOL_LOSS = 1e-5
ATOL = 1e-5


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sequences")
    with rendezvous.hosted_store() as port:
        mp.spawn(qc.run_training, args=(port, str(out)), nprocs=qc.WORLD_SIZE)
    return torch.load(Path(out) / "results.pt")


@pytest.mark.parametrize("case", qc.cases(), ids=lambda case: case.name)
def test_two_ranks_train_sequences_like_one_process(distributed: dict[str, Any], case: qc.Case) -> None:
    model, tables_of = qc.reference(case)
    losses = qc.train(model, None, rank=0, world_size=1)
    got = distributed[case.name]
    present = [kind for kind in qc.SEQUENCE_TYPES if kind in case.types.values()]
    assert got["groups"] == ["table_wise", *(f"{kind}_sequence" for kind in present)]

    relative = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], losses))
    assert relative <= RTOL_LOSS, f"losses {got['losses']} vs one process {losses}"
    expected = tables_of(model)
    assert sorted(got["tables"]) == sorted(expected)
    for name, table in expected.items():
        torch.testing.assert_close(got["tables"][name], table, rtol=0, atol=ATOL)
    for name, tensor in model.named_parameters():
        torch.testing.assert_close(got["dense"][name], tensor, rtol=0, atol=ATOL)


def test_every_case_moves_every_sequence_table(distributed: dict[str, Any]) -> None:
    """Equal tables mean something only if training changed them."""
    initial = qc.tables_of(qc.build(qc.cases()[0], None, 1))
    for case in qc.cases():
        for table in qc.SEQUENCES:
            name = f"{table.name}.weight"
            moved = (distributed[case.name]["tables"][name] - initial[name]).abs().max()
            assert moved > 1e-3, f"{case.name}: {name} moved by {float(moved)} only"


def test_a_table_row_wise_sequence_table_is_refused_naming_it(distributed: dict[str, Any]) -> None:
    for rank in range(qc.WORLD_SIZE):
        assert distributed["errors"][rank]["table_row_wise"] == (
            "plan for table 's1' (table_row_wise): sequence tables may be data_parallel, "
            "table_wise, column_wise, row_wise, not table_row_wise"
        )


def test_an_out_of_range_sequence_id_names_feature_sample_table_and_rank(distributed: dict[str, Any]) -> None:
    for rank in range(qc.WORLD_SIZE):
        got = distributed["errors"][rank]
        assert got["bad_id"] == (
            f"feature 'h0' at sample {got['first_sample']}: id 40 out of range for table 's0' "
            f"with 40 rows (on rank {rank})"
        )
