"""Errors of the sharded runtime: clear messages, and a failing rank ends the job.

Two ranks built from different plans both fail at construction, naming the
rank and the plan hashes; a rank fed an out-of-range id raises on that rank,
naming feature, id, table and rank, and the job ends with that error (here
torch.multiprocessing.spawn raises it; torchrun exits non-zero the same way).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import rendezvous
import sharded_cases as sc
import torch.multiprocessing as mp

from runtime.config.embeddings import EmbeddingOptimizer
from runtime.sharding import SparseArch


def test_a_bad_rank_ends_the_job_with_its_error(tmp_path: Path) -> None:
    _, _, message = sc.bad_batch(rank=1)
    with pytest.raises(mp.ProcessRaisedException, match=re.escape(message)) as raised:
        with rendezvous.hosted_store() as port:
            mp.spawn(sc.run_errors, args=(port, str(tmp_path)), nprocs=sc.WORLD_SIZE)
    assert "IdOutOfRange" in str(raised.value)
    assert "Process 1 terminated" in str(raised.value)
    for rank in range(sc.WORLD_SIZE):
        text = (tmp_path / f"plan_error_{rank}.txt").read_text()
        assert re.fullmatch(
            r"rank 1's sharding plan does not match rank 0's \(sha256 [0-9a-f]{12}… on rank 0, "
            r"[0-9a-f]{12}… on rank 1\): "
            r"every rank must build the model from the same sharding plan",
            text,
        ), text


def test_a_plan_for_another_world_size_fails() -> None:
    with pytest.raises(ValueError) as raised:
        SparseArch(sc.TABLES, EmbeddingOptimizer(), sc.make_plan(sc.MIXED))
    assert str(raised.value) == ("the plan is for world size 2 but this job has 1 rank: recompile with --world-size 1")
