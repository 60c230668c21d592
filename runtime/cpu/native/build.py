"""Build and load the C kernels of runtime/cpu/native, and say why not when that fails.

The sources are plain C with no torch headers: `$CC` (default `cc`) builds
them in a second with -O3 -march=native into
`$RECCOMPILE_CACHE_DIR` (default `~/.cache/reccompile`)/native/, under a name
hashed from the sources, the flags, the compiler and the CPU, written
atomically so that ranks starting together can race safely. `status()` says
what happened: the loaded library, or one of three causes the user can act
on (no compiler, the compiler's first error, a library that does not load).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FLAGS", "SOURCES", "BuildStatus", "cache_root", "compiler_name", "cpu_identity", "status"]

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.c")))
FLAGS = (
    "-O3", "-march=native", "-fPIC", "-shared",
    # Reassociating sums lets the compiler vectorise the reductions, as a GEMM would.
    "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
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
    """The outcome of building and loading the kernels: `library`, or the `problem` in words."""

    compiler: str
    library: ctypes.CDLL | None
    path: Path | None
    problem: str | None


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


def first_error(stderr: str) -> str:
    """The compiler's first error line (`file:line:col: error: ...`), else its first line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no message")


def _build(compiler: str, target: Path) -> str | None:
    """Builds the library at `target`; the compiler's first error line if it could not."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(handle)
    try:
        for extra in (OPENMP_FLAGS, ()):
            command = [compiler, *FLAGS, *extra, *map(str, SOURCES), "-o", scratch]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode == 0:
                os.replace(scratch, target)
                return None
        return f"{first_error(done.stderr)} (exit status {done.returncode})"
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


def _target(compiler: str) -> Path:
    key = hashlib.sha256(
        b"\0".join(
            part.encode() if isinstance(part, str) else part
            for part in (
                *(source.read_bytes() for source in SOURCES),
                " ".join(FLAGS + OPENMP_FLAGS), compiler, platform.machine(), cpu_identity(),
            )
        )
    ).hexdigest()[:16]
    return cache_root() / "native" / f"kernels-{key}.so"


@functools.cache
def status() -> BuildStatus:
    """Builds (once per source, flags, compiler and CPU) and loads the kernels; never raises."""
    compiler = compiler_name()
    found = shutil.which(compiler)
    if found is None:
        return BuildStatus(compiler, None, None, f"no C compiler: {compiler!r} is not on PATH (set CC to one)")
    target = _target(found)
    if not target.exists():
        error = _build(found, target)
        if error is not None:
            return BuildStatus(compiler, None, None, f"{compiler} could not build {SOURCES[0].parent}: {error}")
    try:
        return BuildStatus(compiler, ctypes.CDLL(str(target)), target, None)
    except OSError as exc:
        return BuildStatus(compiler, None, target, f"{target} was built by {compiler} but does not load: {exc}")
