"""Tests for runtime/cpu/openmp.py: the spin a training process's OpenMP workers take."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.cli import main
from runtime.cpu import openmp

REPO = Path(__file__).resolve().parents[3]


def test_the_setting_is_made_unless_the_user_made_one() -> None:
    environ: dict[str, str] = {}
    assert openmp.training_environment(environ)
    assert environ == {"GOMP_SPINCOUNT": "1000"}
    mine = {"GOMP_SPINCOUNT": "250000"}
    assert not openmp.training_environment(mine)
    assert mine == {"GOMP_SPINCOUNT": "250000"}


@pytest.mark.parametrize("policy", ["active", "passive"])
def test_a_wait_policy_the_user_set_is_not_overridden(policy: str) -> None:
    """libgomp takes GOMP_SPINCOUNT over OMP_WAIT_POLICY: setting it would undo the user's policy."""
    environ = {"OMP_WAIT_POLICY": policy}
    assert not openmp.training_environment(environ)
    assert environ == {"OMP_WAIT_POLICY": policy}


@pytest.mark.parametrize(("command", "expected"), [("train", "1000"), ("predict", None), ("compile", None)])
def test_reccompile_train_sets_it_before_torch_loads(command: str, expected: str | None, monkeypatch) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "")  # so that teardown restores the variable's first state,
    monkeypatch.delenv("GOMP_SPINCOUNT")  # whatever main sets
    assert main([command, "--help"]) == 0
    assert os.environ.get("GOMP_SPINCOUNT") == expected


def test_a_fresh_train_process_sets_it_before_torch_is_imported() -> None:
    """In a new interpreter, `reccompile train` sets the variable while torch is not yet imported."""
    probe = (
        "import sys\n"
        "from compiler import cli\n"
        "from runtime.cpu import openmp\n"
        "setter = openmp.training_environment\n"
        "openmp.training_environment = lambda environ: print('torch' in sys.modules, setter(environ))\n"
        "cli.main(['train', '--help'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.stdout.splitlines()[0] == "False True", done.stderr[-2000:]
