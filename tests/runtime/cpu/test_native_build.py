"""Tests for runtime/cpu/native/build.py: the sources compile for every target this machine's
compilers reach, and a failed build or load is reported by its cause."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
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
            capture_output=True,
            text=True,
            check=False,
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
    compiler = _fake_compiler(
        fresh_build,
        (
            "echo 'quant_pool.c: In function f:' >&2\n"
            "echo 'quant_pool.c:45:12: error: implicit declaration of function _cvtsh_ss' >&2\n"
            "echo 'quant_pool.c:50:1: error: another' >&2\n"
            "exit 1\n"
        ),
    )
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
    compiler = _fake_compiler(
        fresh_build, 'while [ "$1" != "-o" ]; do shift; done\nyes garbage | head -c 4096 > "$2"\n'
    )
    monkeypatch.setenv("CC", compiler)
    outcome = build.status()
    assert outcome.library is None and outcome.path is not None
    assert outcome.problem == (
        f"{outcome.path} was built by {compiler} but does not load: {outcome.path}: invalid ELF header"
    )


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (  # g++ warns about a C-only flag before the error itself
            "cc1plus: warning: '-Werror=' argument '-Werror=implicit-function-declaration' is not valid for C++\n"
            "dot_interaction.c:125:25: error: invalid conversion from 'void*' to 'float*'\n",
            "dot_interaction.c:125:25: error: invalid conversion from 'void*' to 'float*'",
        ),
        (  # collect2's summary says only that ld failed; ld's own line says why
            "/usr/bin/ld: final link failed: No space left on device\ncollect2: error: ld returned 1 exit status\n",
            "/usr/bin/ld: final link failed: No space left on device",
        ),
        (
            "quant_pool.c:3:10: fatal error: missing.h: No such file or directory\n",
            "quant_pool.c:3:10: fatal error: missing.h: No such file or directory",
        ),
        ("something went wrong\n", "something went wrong"),
        ("", "no message"),
    ],
)
def test_the_first_error_is_the_line_that_says_why(output: str, line: str) -> None:
    assert build.first_error(output) == line


def test_a_compiler_that_reports_on_stdout_is_quoted(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", _fake_compiler(fresh_build, "echo 'license expired: cannot compile'\nexit 3\n"))
    assert build.status().problem.endswith(": license expired: cannot compile (exit status 3)")


def test_cc_may_carry_arguments(fresh_build: Path, monkeypatch: pytest.MonkeyPatch, native_kernels: None) -> None:
    log = fresh_build / "args.txt"
    wrapper = _fake_compiler(fresh_build, f'echo "$@" > {log}\nshift\nexec "$@"\n')  # drops its first argument
    monkeypatch.setenv("CC", f"{wrapper} --ignored {shutil.which(build.compiler_name())} -std=gnu11")
    build.status.cache_clear()
    outcome = build.status()
    assert outcome.problem is None and outcome.library is not None, outcome.problem
    assert log.read_text().startswith(f"--ignored {shutil.which('cc')} -std=gnu11 -O3 ")


def test_a_cached_library_that_does_not_load_is_built_again(fresh_build: Path, native_kernels: None) -> None:
    cached = build.status().path
    cached.write_bytes(b"not a library")
    # Another process: this one has the library loaded, and dlopen would answer from memory.
    probe = "from runtime.cpu.native import build; s = build.status(); print(s.problem, s.path)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout == f"None {cached}\n"
    assert cached.read_bytes()[:4] == b"\x7fELF"


def test_an_unwritable_cache_builds_in_a_temporary_directory_and_says_so(
    fresh_build: Path, native_kernels: None
) -> None:
    shutil.rmtree(fresh_build / "cache")
    (fresh_build / "cache").write_text("a file where the cache directory should be")
    build.status.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.library() is not None
    outcome = build.status()
    assert outcome.path is None and outcome.problem is None
    assert outcome.note.startswith(f"the kernel cache {fresh_build / 'cache' / 'native'} cannot be written ([Errno 20]")
    assert outcome.note.endswith("): built in a temporary directory, again in each process")
    assert [str(w.message) for w in caught] == [f"reccompile: native kernels: {outcome.note}"]


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
