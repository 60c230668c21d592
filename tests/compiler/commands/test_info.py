"""Tests for compiler/commands/info.py: `reccompile info`."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import fbgemm_gpu
import pytest
import torch

from compiler.cli import main
from runtime.cpu import choice, features
from runtime.cpu.native import build


@pytest.fixture(autouse=True)
def _cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RECCOMPILE_KERNELS", raising=False)
    build.status.cache_clear()
    yield
    build.status.cache_clear()


def _head(tmp_path: Path, native: str) -> list[str]:
    return [
        f"cpu: {features.model()} ({platform.machine()})",
        f"vector features: {' '.join(features.vector_features()) or 'none'}",
        f"torch {torch.__version__}, fbgemm_gpu {fbgemm_gpu.__version__}, {torch.get_num_threads()} threads",
        f"native kernels: {native}",
        f"kernel choices (measured on this CPU, in {choice.directory(tmp_path)}):",
    ]


def test_info_names_the_cpu_the_kernels_and_each_choice_with_its_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, native_kernels: None
) -> None:
    assert main(["info"]) == 0
    built = build.status().path
    assert capsys.readouterr().out.splitlines() == [
        *_head(tmp_path, f"built ({built})"),
        "  none yet: each is measured at its first use",
    ]
    folder = choice.directory(tmp_path) / "dot"
    (folder).mkdir(parents=True)
    (folder / "b2048_n27_d64.json").write_text(
        json.dumps(
            {"kernel": "dot", "shape": "b2048_n27_d64", "winner": "native", "times_ms": {"native": 2.5, "torch": 7.25}}
        )
    )
    monkeypatch.setenv("RECCOMPILE_KERNELS", "linear=aten")
    assert main(["info"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        *_head(tmp_path, f"built ({built})"),
        "  dot        b2048_n27_d64                                    native     (native 2.50 ms, torch 7.25 ms)",
        "forced by RECCOMPILE_KERNELS: linear=aten",
    ]


def test_info_says_why_the_native_kernels_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "no-such-cc")
    monkeypatch.setenv("RECCOMPILE_KERNELS", "dot=native,linear=aten")
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    missing = "no C compiler: 'no-such-cc' is not on PATH (set CC to one)"
    assert lines[3] == f"native kernels: unavailable: {missing}"
    assert lines[-2:] == [
        "forced by RECCOMPILE_KERNELS: dot=native, linear=aten",
        f"  dot=native is unavailable here (native kernels: {missing}): dot runs torch",
    ]


def test_a_bad_override_is_a_usage_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECCOMPILE_KERNELS", "dot=fast")
    assert main(["info"]) == 2
    assert capsys.readouterr().out.startswith("error: RECCOMPILE_KERNELS: 'dot=fast' is not a kernel choice;")
