"""compiler/pipeline.py: the host size a launcher passes yields to the command line's and the spec's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime" / "checkpoint"))
import checkpoint_cases as cc  # noqa: E402
from compiler.pipeline import Options, compile_spec  # noqa: E402


def table_row_wise_ranks(spec: Path, options: Options) -> list[int]:
    """The ranks of table `e` (table_row_wise in the checkpoint spec)."""
    return sorted({shard.rank for shard in compile_spec(str(spec), options).plan.table("e").shards})


@pytest.mark.parametrize(
    ("spec_says", "options", "ranks"),
    [
        ("", Options(world_size=2), [0, 1]),  # no host size anywhere: all ranks on one host
        ("", Options(world_size=2, launched_ranks_per_host=1), [0]),  # torchrun's 2 nodes x 1 rank
        ("", Options(world_size=2, ranks_per_host=2, launched_ranks_per_host=1), [0, 1]),  # the command line
        (
            "  world_size: 2\n  ranks_per_host: 2\n",
            Options(world_size=2, launched_ranks_per_host=1),
            [0, 1],
        ),  # the spec
    ],
)
def test_the_launchers_ranks_per_host_is_the_default(
    tmp_path: Path, spec_says: str, options: Options, ranks: list[int]
) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(cc.SPEC.replace("sharding:\n", "sharding:\n" + spec_says))
    assert table_row_wise_ranks(spec, options) == ranks
