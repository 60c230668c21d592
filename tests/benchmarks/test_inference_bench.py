"""benchmarks/inference_bench.py's lines name the kernels of the process that measured them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from runtime.cpu import choice

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script imports its neighbour `harness`, as it does when run from benchmarks/."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("inference_bench", REPO / "benchmarks" / "inference_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _printing(record: dict) -> list[str]:
    return [sys.executable, "-c", f"print({json.dumps(json.dumps(record))})"]


def test_each_sides_lines_carry_the_measuring_processs_kernels_not_the_parents(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _script()
    monkeypatch.delenv(choice.ENV, raising=False)
    monkeypatch.setattr(choice, "_used", {"dot": {"b1": "torch"}})  # what this (parent) process ran itself
    monkeypatch.setattr(choice, "_forced_used", {})
    ours = {"config": "int8", "variant": "criteo", "batch": 1, "p50_ms": 1.0,
            "kernels": {"quant_pool": {"b1_x": "native"}}}  # fmt: skip
    theirs = {"precision": "int8", "variant": "criteo", "batch": 1, "p50_ms": 2.0}
    rows = bench.run_side(_printing(ours), "reccompile", 0) + bench.run_side(_printing(theirs), "torchrec", 0)
    assert [row["kernels"] for row in rows] == [{"quant_pool": {"b1_x": "native"}}, {}]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kernels"] for line in printed] == [{"quant_pool": {"b1_x": "native"}}, {}]
    bench.emit({"sizes": {}})
    assert json.loads(capsys.readouterr().out)["kernels"] == {"dot": {"b1": "torch"}}


def test_the_summary_pairs_each_rounds_runs_of_a_configuration() -> None:
    bench = _script()

    def row(impl: str, round_: int, pair: str, samples: float, **key: object) -> dict:
        name = {"config": pair} if impl == "reccompile" else {"precision": bench.parts(pair)[0]}
        return {"impl": impl, "round": round_, "pair": pair, "variant": "criteo", "batch": 512, "p50_ms": 1.0,
                "p99_ms": 1.0, "samples_per_s": samples, "other_cpu_pct": 0.0, **name, **key}

    rows = [
        row("reccompile", 0, "int8", 120.0), row("torchrec", 0, "int8", 60.0),  # 2.0
        row("reccompile", 1, "int8", 80.0), row("torchrec", 1, "int8", 50.0),  # 1.6: a slow minute for both
        row("reccompile", 2, "int8", 110.0), row("torchrec", 2, "int8", 70.0),  # 1.57
        row("torchrec", 2, "int8/bf16", 40.0),  # TorchRec's int8 again, beside another configuration
    ]
    line = next(r for r in bench.summarise(rows, ["int8"], 10.0) if (r["variant"], r["batch"]) == ("criteo", 512))
    assert line["paired_ratios"] == [2.0, 1.6, 1.57]
    assert line["paired_ratio"] == 1.6
    assert line["reccompile_samples_per_s"] == 110.0 and line["torchrec_samples_per_s"] == 55.0
    assert line["ratio"] == 2.0


def test_a_host_gemm_probe_reports_a_positive_speed() -> None:
    assert _script().host_gemm_gflops(0.01) > 0
