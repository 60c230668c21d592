"""Shared test fixtures: golden-file comparison (`pytest --update-goldens`), the native kernels."""

from __future__ import annotations

import difflib
import shlex
import shutil
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite golden files with the current output instead of comparing",
    )


class Golden:
    """Compares text against a file, or rewrites it under --update-goldens."""

    def __init__(self, update: bool) -> None:
        self.update = update

    def check(self, path: Path | str, actual: str) -> None:
        path = Path(path)
        if not path.is_absolute():
            path = GOLDEN_DIR / path
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing; run pytest --update-goldens")
        expected = path.read_text()
        if expected != actual:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(keepends=True),
                    actual.splitlines(keepends=True),
                    fromfile=f"{path} (golden)",
                    tofile=f"{path} (actual)",
                )
            )
            pytest.fail(f"output differs from golden file:\n{diff}", pytrace=False)


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(request.config.getoption("--update-goldens"))


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def native_kernels() -> None:
    """Skips only where no C compiler exists; where one does, a failed build or load fails the test."""
    from runtime.cpu.native import build

    program = (shlex.split(build.compiler_name()) or [""])[0]  # CC may carry arguments: `ccache gcc`
    if not program or shutil.which(program) is None:
        pytest.skip(f"no C compiler: looked for {program!r} ($CC, else cc) on PATH")
    outcome = build.status()
    if outcome.library is None:
        pytest.fail(f"the native kernels did not build or load: {outcome.problem}", pytrace=False)
