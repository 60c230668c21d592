"""Shared test fixtures: golden-file comparison (`pytest --update-goldens`), the native kernels,
the `ranks` marker on test files that start ranks (`make test-fast` leaves them out), and torch's
thread count put back after each test and file, so no test's numbers depend on which ran before."""

from __future__ import annotations

import difflib
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
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
    parser.addoption(
        "--update-static-baseline",
        action="store_true",
        default=False,
        help="rewrite tests/golden/static_checks.txt with today's ruff and mypy findings",
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


# A test file starts ranks when it opens a rendezvous (tests/rendezvous.py) or launches
# `train --nproc N` with N > 1. Marked per file: which test of a file starts them is only
# known by running it, and the guard below fails a test that starts ranks unmarked.
_STARTS_RANKS = re.compile(r"hosted_store|launcher_port|[\"']--nproc[\"'],\s*[\"'][2-9]|--nproc [2-9]|nproc=[2-9]")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ranks: the test file starts ranks (gloo process groups, torchrun)")


# The files that take longest (each 1.5 to 2.5 minutes of a worker on a 2-core Xeon), run first, then
# the other files that start ranks, then the rest: pytest-xdist's --dist loadfile hands out files in
# this order, so the two workers end together instead of one finishing a long file alone.
SLOWEST_FILES = (
    "tests/compiler/commands/test_data_prepare.py",
    "tests/compiler/serving/test_export_zoo.py",
    "tests/compiler/codegen/test_emit.py",
    "tests/compiler/commands/test_train_nodes.py",
    "tests/compiler/commands/test_train_distributed.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    starts: dict[Path, bool] = {}
    for item in items:
        path = Path(item.path)
        if path not in starts:
            starts[path] = bool(_STARTS_RANKS.search(path.read_text()))
        if starts[path]:
            item.add_marker(pytest.mark.ranks)
    root = Path(config.rootpath)
    slowest = {root / name: rank for rank, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: (slowest.get(Path(item.path), len(slowest)), not starts[Path(item.path)]))


@pytest.fixture(autouse=True)
def _ranks_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails a test that opens a rendezvous without the `ranks` marker, so `make test-fast` stays rank-free."""
    rendezvous = sys.modules.get("rendezvous")  # tests/rendezvous.py, imported by the files that use it
    if rendezvous is None or request.node.get_closest_marker("ranks") is not None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail(
            f"{request.node.nodeid} starts ranks but its file is not marked `ranks`; "
            "see _STARTS_RANKS in tests/conftest.py",
            pytrace=False,
        )

    monkeypatch.setattr(rendezvous, "hosted_store", refuse)
    monkeypatch.setattr(rendezvous, "launcher_port", refuse)


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")  # not imported: no thread count to keep
    return None if torch is None else torch.get_num_threads()


def _put_back_torch_threads(before: int | None) -> None:
    if before is not None and _torch_threads() != before:
        sys.modules["torch"].set_num_threads(before)


@pytest.fixture(autouse=True, scope="module")
def _torch_threads_per_module() -> Iterator[None]:
    """torch's thread count as the file found it, after the file: a module fixture that trains in
    this process (`train`, `predict` set the count the machine's load gives) leaves it to no other file."""
    before = _torch_threads()
    yield
    _put_back_torch_threads(before)


@pytest.fixture(autouse=True)
def _torch_threads_per_test() -> Iterator[None]:
    """torch's thread count as the test found it, after the test (see `_torch_threads_per_module`)."""
    before = _torch_threads()
    yield
    _put_back_torch_threads(before)


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
