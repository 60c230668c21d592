"""SparseArch in one process: initialisation independent of the plan, and its state dict."""

from __future__ import annotations

import sharded_cases as sc
import torch

from runtime.config.embeddings import EmbeddingOptimizer
from runtime.sharding import SparseArch

OPTIMIZER = EmbeddingOptimizer("rowwise_adagrad")


def one_process_plan(kernel: str) -> dict:
    plan = sc.make_plan(sc.MIXED, world_size=1)
    for entry in plan["tables"]:
        entry["compute_kernel"] = kernel
    return plan


def test_tables_and_the_global_generator_do_not_depend_on_plan_or_kernel() -> None:
    """So dense layers built after the SparseArch start alike at every world size too."""
    built = []
    for kernel in ("fused", "dense"):
        torch.manual_seed(3)
        arch = SparseArch(sc.TABLES, OPTIMIZER, one_process_plan(kernel))
        built.append((arch.full_state_dict(), torch.rand(4)))
    (tables, after), (other_tables, other_after) = built
    assert torch.equal(after, other_after)
    for name, table in tables.items():
        assert torch.equal(table, other_tables[name])
        low, high = sc.TABLES[int(name[1])].init_range()
        assert low <= float(table.min()) and float(table.max()) <= high


def test_state_dict_holds_whole_tables_by_name_and_loads_back() -> None:
    torch.manual_seed(0)
    arch = SparseArch(sc.TABLES, OPTIMIZER, one_process_plan("fused"))
    state = arch.state_dict()
    assert sorted(state) == sorted(f"t{i}.{s}" for i in range(5) for s in ("weight", "momentum1"))
    torch.manual_seed(1)
    other = SparseArch(sc.TABLES, OPTIMIZER, one_process_plan("dense"))
    other.load_state_dict(state)
    for name, table in arch.full_state_dict().items():
        assert torch.equal(other.full_state_dict()[name], table)
