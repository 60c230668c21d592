"""Tests of compiler/ir_text.py: `reccompile show` of every valid spec (specs/, tests/specs/valid/) as goldens."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from compiler.cli import main
from compiler.ir_text import format_ir
from compiler.spec.load import load
from compiler.spec.validate import validate

REPO = Path(__file__).resolve().parents[2]
SPEC_FILES = [*(REPO / "specs").rglob("*.yaml"), *(REPO / "tests" / "specs" / "valid").glob("*.yaml")]
SPECS = sorted(str(path.relative_to(REPO)) for path in SPEC_FILES)


@pytest.mark.parametrize("spec", SPECS)
def test_show_golden(spec: str, golden, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["show", spec]) == 0
    golden.check(f"show/{Path(spec).stem}.txt", capsys.readouterr().out)


@pytest.mark.parametrize("spec", SPECS)
def test_the_text_form_is_yaml_and_deterministic(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    text = format_ir(validate(load(spec)))
    assert text == format_ir(validate(load(spec)))
    resolved = yaml.safe_load(text)
    assert resolved["source"] == spec
    assert list(resolved["model"]) == [block.name for block in validate(load(spec)).blocks]
