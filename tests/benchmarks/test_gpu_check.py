"""benchmarks/gpu_check.py: on this machine (no GPU) it says so and exits 0; its check specs compile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402


@pytest.mark.skipif(gpu_check.gpu_name() is not None, reason="a CUDA GPU is present: the no-GPU path does not run")
def test_without_a_gpu_it_says_so_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {
        "check": "gpu",
        "ok": True,
        "skipped": True,
        "detail": "no CUDA GPU on this machine (torch.cuda.is_available() is False): nothing to check",
    }


def test_an_unknown_check_is_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--only", "train:nope"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "error: --only: unknown check 'train:nope' (known: train:data_parallel, train:table_wise, "
        "train:column_wise, train:row_wise, train:table_row_wise, train:pipeline, export+predict, dlrm-bench)\n"
    )


def test_every_check_spec_compiles_for_cuda_with_its_sharding_types(tmp_path: Path) -> None:
    """The specs the GPU will train: valid, planned for CUDA, each table of the type the check names."""
    from compiler.pipeline import compile_spec

    for case in (*gpu_check.SHARDING_TYPES, "mixed"):
        spec = tmp_path / f"{case}.yaml"
        spec.write_text(gpu_check.spec_text(case))
        plan = compile_spec(str(spec)).plan
        types = {table.table: table.sharding_type for table in plan.tables}
        want = dict(zip(gpu_check.TABLES, gpu_check.SHARDING_TYPES if case == "mixed" else (case,) * 5))
        assert types == want
        assert plan.device == "cuda"
