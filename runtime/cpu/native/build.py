"""Build and load the C kernels of runtime/cpu/native, and say why not when that fails.

The sources are plain C with no torch headers: `$CC` (default `cc`) builds
them in a second with -O3 -march=native into
`$RECCOMPILE_CACHE_DIR` (default `~/.cache/reccompile`)/native/, under a name
hashed from the sources, the flags, the compiler and the CPU, written
atomically so that ranks starting together can race safely. `$CC` may carry
arguments (`ccache gcc`). `status()` says what happened: the loaded library,
or one of three causes the user can act on (no compiler, the compiler's
first error, a library that does not load). A cached library that does not
load (a damaged file, a broken compiler's output) is built again once; a
cache that cannot be written costs a build per process in a temporary
directory, which `BuildStatus.note` says.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["FLAGS", "SOURCES", "BuildStatus", "cache_root", "compiler_name", "cpu_identity", "status"]

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.c")))
FLAGS = (
    "-O3",
    "-march=native",
    "-fPIC",
    "-shared",
    # Reassociating sums lets the compiler vectorise the reductions, as a GEMM would.
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
    # A call to an undeclared intrinsic would build and then fail to load (undefined symbol).
    "-Werror=implicit-function-declaration",
)
# Threads come from OpenMP. The library names libgomp.so.1, which the loader
# resolves to the copy torch has already loaded (torch/lib/libgomp.so.1), so
# the kernels run on torch's own thread pool. A compiler without OpenMP
# builds the serial variant.
OPENMP_FLAGS = ("-fopenmp",)


@dataclass(frozen=True)
class BuildStatus:
    """The outcome of building and loading the kernels: `library`, or the `problem` in words.

    `note`: something the user should know although the library loaded (`path` is then None: it
    was built in a temporary directory since removed)."""

    compiler: str
    library: ctypes.CDLL | None
    path: Path | None
    problem: str | None
    note: str | None = None


def cache_root() -> Path:
    """`$RECCOMPILE_CACHE_DIR`, else `$XDG_CACHE_HOME/reccompile`, else `~/.cache/reccompile`."""
    root = os.environ.get("RECCOMPILE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reccompile"


def cache_settings() -> str:
    """What `cache_root()` is made from, read without building it: a key for callers memoising per cache."""
    root = os.environ.get("RECCOMPILE_CACHE_DIR")
    return root if root else f"\0{os.environ.get('XDG_CACHE_HOME')}\0{os.environ.get('HOME')}"


def compiler_name() -> str:
    """The C compiler looked for: `$CC`, else `cc`."""
    return os.environ.get("CC") or "cc"


def cpu_identity() -> str:
    """What -march=native depends on: the CPU's feature flags where Linux lists them."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def first_error(output: str) -> str:
    """The line that says why a build failed: the compiler's first error (`file:line:col: error: ...`),
    else the linker's own line (collect2's summary says only that ld failed), else the first line
    naming an error that is not a warning, else the first line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ranked = (
        lambda line: (": error:" in line or "fatal error" in line) and not line.startswith("collect2:"),
        lambda line: re.match(r"(\S*/)?ld(\.\w+)?: ", line) is not None,
        lambda line: "error" in line.lower() and "warning:" not in line,
    )
    for wanted in ranked:
        found = next((line for line in lines if wanted(line)), None)
        if found is not None:
            return found
    return lines[0] if lines else "no message"


def _build(command: list[str], target: Path) -> str | None:
    """Builds the library at `target` with `command` (the compiler and its own arguments); the
    compiler's first error line if it could not. Raises OSError if `target`'s folder cannot be written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(handle)
    try:
        for extra in (OPENMP_FLAGS, ()):
            done = subprocess.run(
                [*command, *FLAGS, *extra, *map(str, SOURCES), "-o", scratch],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode == 0:
                os.chmod(scratch, 0o755)  # mkstemp's 0600 would keep it from others sharing the cache
                os.replace(scratch, target)
                return None
        return f"{first_error(done.stderr or done.stdout)} (exit status {done.returncode})"
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


def _target(command: list[str]) -> Path:
    key = hashlib.sha256(
        b"\0".join(
            part.encode() if isinstance(part, str) else part
            for part in (
                *(source.read_bytes() for source in SOURCES),
                " ".join(FLAGS + OPENMP_FLAGS),
                *command,
                platform.machine(),
                cpu_identity(),
            )
        )
    ).hexdigest()[:16]
    return cache_root() / "native" / f"kernels-{key}.so"


def _load(compiler: str, command: list[str], target: Path) -> BuildStatus:
    """Loads the library at `target`, building it first if absent, or again once if it does not load.
    Raises OSError if it must be (re)built and `target`'s folder cannot be written."""
    built = False
    if not target.exists():
        error = _build(command, target)
        if error is not None:
            return BuildStatus(compiler, None, None, f"{compiler} could not build {SOURCES[0].parent}: {error}")
        built = True
    try:
        return BuildStatus(compiler, ctypes.CDLL(str(target)), target, None)
    except OSError as exc:
        problem = f"{target} was built by {compiler} but does not load: {exc}"
    if built:
        return BuildStatus(compiler, None, target, problem)
    target.unlink(missing_ok=True)  # left by an earlier build (a damaged file, a broken compiler's output)
    return _load(compiler, command, target)


@functools.cache
def status() -> BuildStatus:
    """Builds (once per source, flags, compiler and CPU) and loads the kernels; never raises."""
    compiler = compiler_name()
    try:
        words = shlex.split(compiler)
    except ValueError as exc:
        return BuildStatus(compiler, None, None, f"CC={compiler!r} is not a command line: {exc}")
    found = shutil.which(words[0]) if words else None
    if found is None:
        missing = words[0] if words else compiler
        return BuildStatus(compiler, None, None, f"no C compiler: {missing!r} is not on PATH (set CC to one)")
    command = [found, *words[1:]]
    target = _target(command)
    try:
        return _load(compiler, command, target)
    except OSError as exc:
        cannot = f"the kernel cache {target.parent} cannot be written ({exc})"
    try:
        with tempfile.TemporaryDirectory(prefix="reccompile-native-") as private:
            outcome = _load(compiler, command, Path(private) / target.name)
    except OSError as exc:
        return BuildStatus(compiler, None, None, f"{cannot}, nor a temporary directory ({exc})")
    if outcome.library is None:
        return outcome
    return replace(outcome, path=None, note=f"{cannot}: built in a temporary directory, again in each process")
