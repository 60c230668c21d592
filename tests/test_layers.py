"""The import contracts of pyproject.toml ([tool.importlinter]) hold: `lint-imports` passes.

The runtime never imports the compiler, and the runtime's packages import
downward only (train | serving > checkpoint > reporting > data > sharding >
retrieval > modules | embeddings > cpu | sparse | storage | process | features >
config, the torch-free contract room), and inside `modules` the blocks and the heads'
losses are built from `layers`, never the reverse; the data readers and reporting import
no model module (their configs are in runtime.config); the online server's
modules import downward too (app > registry > batcher | models > protocol | metrics >
raw_rows). The compiler's packages import downward (cli > commands > serving |
golden > pipeline > codegen > lowering > spec | planner > diagnostics | ir_text
> ir), and no two siblings of any package of either import each other, even
through others (acyclic_siblings). A broken contract fails this test with
lint-imports' report, which names the importing line.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert "Contracts: 7 kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("module", "contract", "report"),
    [
        (
            "runtime/sparse/jagged.py:from runtime.train import loop",
            "The runtime's packages import downward only",
            "runtime.sparse.jagged -> runtime.train.loop (l.",
        ),
        (
            "compiler/spec/load.py:from compiler.lowering import lower",
            "The compiler's packages import downward only",
            "compiler.spec.load -> compiler.lowering.lower (l.",
        ),
        (
            "runtime/modules/layers/dropout.py:from runtime.modules.blocks import pooled",
            "The model's blocks are built from layers, never the reverse",
            "runtime.modules.layers.dropout -> runtime.modules.blocks.pooled (l.",
        ),
        (
            "runtime/data/tables/parquet_files.py:from runtime.data.prepared import reading",
            "No cycles between the siblings of any package",
            "- .tables -> .prepared (1 import)",
        ),
    ],
)
def test_a_wrong_import_breaks_its_contract(tmp_path: Path, module: str, contract: str, report: str) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    (copy / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for package in ("runtime", "compiler"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    path, line = module.split(":", 1)
    source = copy / path
    source.write_text(source.read_text() + f"\n{line}  # the wrong arrow\n")
    done = run_lint_imports(copy)
    assert done.returncode == 1
    assert f"{contract} BROKEN" in done.stdout
    assert report in done.stdout


def test_the_runtime_never_prints() -> None:
    """Library code logs (or writes its run's lines through runtime.reporting.console); only the CLI prints."""
    calls = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == []
