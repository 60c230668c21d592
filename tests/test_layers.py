"""The import contracts of pyproject.toml ([tool.importlinter]) hold: `lint-imports` passes.

The runtime never imports the compiler, and the runtime's packages import
downward only (train | serving > checkpoint > reporting > data > sharding >
retrieval > modules | embeddings > cpu | sparse | storage | process | features >
config, the torch-free contract room); the data readers and reporting import
no model module (their configs are in runtime.config); the online server's
modules import downward too (app > registry > batcher | models > protocol | metrics >
raw_rows). A broken contract fails this
test with lint-imports' report, which names the importing line.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def run_lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True
    )


def test_the_import_contracts_are_kept() -> None:
    done = run_lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    (copy / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for package in ("runtime", "compiler"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    sparse = copy / "runtime" / "sparse" / "jagged.py"
    sparse.write_text(sparse.read_text() + "\nfrom runtime.train import loop  # upward\n")
    done = run_lint_imports(copy)
    assert done.returncode == 1
    assert "The runtime's packages import downward only BROKEN" in done.stdout
    assert "runtime.sparse.jagged -> runtime.train.loop (l." in done.stdout


def test_the_runtime_never_prints() -> None:
    """Library code logs (or writes its run's lines through runtime.reporting.console); only the CLI prints."""
    calls = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == []
