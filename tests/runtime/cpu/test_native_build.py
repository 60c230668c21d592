"""Tests for runtime/cpu/native/build.py: the sources compile for every target this machine's
compilers reach, and a failed build or load is reported by its cause."""

from __future__ import annotations

import shutil
import stat
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.cpu import native
from runtime.cpu.native import build

# (compiler, -march): x86-64 without and with AVX2/F16C/FMA, with AVX-512, this CPU; aarch64.
TARGETS = [
    ("cc", "x86-64"),
    ("cc", "x86-64-v2"),
    ("cc", "haswell"),
    ("cc", "skylake-avx512"),
    ("cc", "native"),
    ("aarch64-linux-gnu-gcc", "armv8-a"),
    ("aarch64-linux-gnu-gcc", "armv8.2-a+fp16"),
]


def _machine(compiler: str) -> str:
    return subprocess.run([compiler, "-dumpmachine"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize(("compiler", "march"), TARGETS)
def test_every_source_compiles_for_the_target(compiler: str, march: str, tmp_path: Path) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler} on this machine")
    family = "aarch64" if march.startswith("armv8") else "x86_64"
    if not _machine(compiler).startswith(family):
        pytest.skip(f"{compiler} targets {_machine(compiler)}, not {family}")
    flags = [f"-march={march}" if f == "-march=native" else f for f in build.FLAGS if f != "-shared"]
    for source in build.SOURCES:
        done = subprocess.run(
            [compiler, *flags, *build.OPENMP_FLAGS, "-c", str(source), "-o", str(tmp_path / f"{source.stem}.o")],
            capture_output=True, text=True, check=False,
        )
        assert done.returncode == 0, f"{source.name} with -march={march}: {build.first_error(done.stderr)}"


@pytest.fixture
def fresh_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty kernel cache and no memory of the last build; both are forgotten again afterwards."""
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    build.status.cache_clear()
    native.library.cache_clear()
    yield tmp_path
    build.status.cache_clear()
    native.library.cache_clear()


def _fake_compiler(directory: Path, body: str) -> str:
    script = directory / "fakecc"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_missing_compiler_is_named(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-cc")
    assert build.status().problem == "no C compiler: 'no-such-cc' is not on PATH (set CC to one)"


def test_a_build_error_shows_the_compilers_first_error_line_in_the_warning(
    fresh_build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = _fake_compiler(fresh_build, (
        "echo 'quant_pool.c: In function f:' >&2\n"
        "echo 'quant_pool.c:45:12: error: implicit declaration of function _cvtsh_ss' >&2\n"
        "echo 'quant_pool.c:50:1: error: another' >&2\n"
        "exit 1\n"
    ))
    monkeypatch.setenv("CC", compiler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.library() is None
    assert [str(w.message) for w in caught] == [
        "reccompile: native kernels unavailable, using torch ops instead: "
        f"{compiler} could not build {build.SOURCES[0].parent}: "
        "quant_pool.c:45:12: error: implicit declaration of function _cvtsh_ss (exit status 1)"
    ]
    assert not list((fresh_build / "cache" / "native").glob("*"))  # the scratch file is gone


def test_a_library_that_does_not_load_is_reported_as_such(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = _fake_compiler(fresh_build, 'while [ "$1" != "-o" ]; do shift; done\nyes garbage | head -c 4096 > "$2"\n')
    monkeypatch.setenv("CC", compiler)
    outcome = build.status()
    assert outcome.library is None and outcome.path is not None
    assert outcome.problem == (
        f"{outcome.path} was built by {compiler} but does not load: {outcome.path}: invalid ELF header"
    )


def test_a_working_compiler_builds_once_per_cache(fresh_build: Path, native_kernels: None) -> None:
    outcome = build.status()
    assert outcome.problem is None and outcome.library is not None
    assert [p.name for p in (fresh_build / "cache" / "native").iterdir()] == [outcome.path.name]
    assert build.status() is outcome


def test_cache_settings_change_exactly_when_the_cache_root_does(monkeypatch: pytest.MonkeyPatch) -> None:
    environments = [
        {"RECCOMPILE_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/x", "HOME": "/h"},
        {"RECCOMPILE_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/y", "HOME": "/g"},  # the first still wins
        {"RECCOMPILE_CACHE_DIR": "", "XDG_CACHE_HOME": "/x", "HOME": "/h"},  # empty counts as unset
        {"RECCOMPILE_CACHE_DIR": None, "XDG_CACHE_HOME": "/y", "HOME": "/h"},
        {"RECCOMPILE_CACHE_DIR": None, "XDG_CACHE_HOME": None, "HOME": "/h"},
        {"RECCOMPILE_CACHE_DIR": None, "XDG_CACHE_HOME": None, "HOME": "/g"},
    ]
    seen = []
    for environment in environments:
        for name, value in environment.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        seen.append((build.cache_settings(), build.cache_root()))
    for settings, root in seen:
        assert {r for s, r in seen if s == settings} == {root}  # one settings value, one root
    assert len({s for s, _ in seen}) == len({r for _, r in seen}) == 5
