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
