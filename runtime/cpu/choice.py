"""Choose between two implementations of a kernel by timing both, once per CPU and shape.

Seven places in the runtime hold two implementations that compute the same
thing, one on torch's own ops (the baseline, first in `KERNELS`) and one
faster on some CPUs:

    dot         torch (bmm)        | native (runtime/cpu/native/dot_interaction.c)
    linear      aten (F.linear)    | onednn (runtime/modules/linear.py)
    lookup      sequential groups  | concurrent groups (runtime/embeddings/concurrent.py)
    quant_pool  fbgemm             | native (runtime/cpu/native/quant_pool.c)
    attention   torch (bmm)        | native (runtime/cpu/native/one_query_attention.c)
    embedding_update  fbgemm's backward | native (runtime/cpu/native/rowwise_adagrad.c)
    linear_grad_input g W           | g W padded to 8 columns (runtime/modules/padded_grad.py)

Which is faster depends on the CPU (vector width, cores, cache) and on the
shapes, so at first use `choose` times both on the caller's real shapes:
one warm-up each, then a few interleaved repetitions, the fastest kept (a
neighbour's preemption only ever adds time, so the minimum is the least
noisy figure of what each path costs). The alternative is taken only when it
beats the baseline's by
`MARGIN`, so the choice is never slower than the torch path it replaces.
The outcome is kept on disk next to the native build cache
(`$RECCOMPILE_CACHE_DIR/choices/<cpu>/<kernel>/<shape>.json`), one file per
choice, written once (ranks that measure together all take the file that
landed first), and read through an lru_cache. `reccompile info` lists them.

`RECCOMPILE_KERNELS=dot=torch,linear=onednn` forces a choice per kernel
(tests and benchmarks), without measuring or recording.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.cpu import features
from runtime.cpu.native.build import cache_root

__all__ = ["ENV", "KERNELS", "MARGIN", "Choice", "active", "bucket", "choose", "forced", "machine", "recorded"]

log = logging.getLogger(__name__)

ENV = "RECCOMPILE_KERNELS"
KERNELS: dict[str, tuple[str, str]] = {
    "dot": ("torch", "native"),
    "linear": ("aten", "onednn"),
    "lookup": ("sequential", "concurrent"),
    "quant_pool": ("fbgemm", "native"),
    "attention": ("torch", "native"),
    "embedding_update": ("fbgemm", "native"),
    "linear_grad_input": ("plain", "padded"),
}
MARGIN = 0.03  # the alternative must be 3% faster: timing noise alone never moves off the baseline
REPEATS = 5
_SHAPE = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class Choice:
    """One decision: for `kernel` at `shape`, `winner`, from the fastest times in milliseconds."""

    kernel: str
    shape: str
    winner: str
    times_ms: tuple[tuple[str, float], ...]


def forced() -> dict[str, str]:
    """The choices `RECCOMPILE_KERNELS` forces, by kernel; a ValueError names a bad entry."""
    return _parse_forced(os.environ.get(ENV, ""))


@functools.lru_cache(maxsize=8)
def _parse_forced(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        kernel, _, name = entry.partition("=")
        if kernel not in KERNELS or name not in KERNELS[kernel]:
            expected = ", ".join(f"{k}={'|'.join(v)}" for k, v in KERNELS.items())
            raise ValueError(f"{ENV}: {entry!r} is not a kernel choice; expected comma-separated {expected}")
        out[kernel] = name
    return out


def _directory() -> Path:
    return cache_root() / "choices" / features.identity()


@functools.lru_cache(maxsize=256)
def _read(directory: Path, kernel: str, shape: str) -> Choice | None:
    try:
        data = json.loads((directory / kernel / f"{shape}.json").read_text())
        return Choice(kernel, shape, data["winner"], tuple((k, float(v)) for k, v in data["times_ms"].items()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_once(directory: Path, choice: Choice) -> None:
    """Writes the choice unless one is there already (then that one stands)."""
    folder = directory / choice.kernel
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"kernel": choice.kernel, "shape": choice.shape, "winner": choice.winner,
                       "times_ms": dict(choice.times_ms), "cpu": features.model()})
    handle, scratch = tempfile.mkstemp(dir=folder, suffix=".json.tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.link(scratch, folder / f"{choice.shape}.json")
    except FileExistsError:
        pass
    finally:
        os.unlink(scratch)


@functools.lru_cache(maxsize=8)
def _writable(directory: Path) -> bool:
    """Whether choices can be kept here; if not (warned once), the baselines run unmeasured."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
        return True
    except OSError as exc:
        log.warning("reccompile: kernel choices cannot be kept in %s (%s); using the torch baselines", directory, exc)
        return False


def _fastest_ms(runs: Mapping[str, Callable[[], object]]) -> dict[str, float]:
    """Each run's fastest time over REPEATS interleaved calls, after one warm-up call each."""
    for run in runs.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: min(times) for name, times in samples.items()}


def choose(kernel: str, shape: str, runs: Mapping[str, Callable[[], object]]) -> str:
    """The implementation of `kernel` to use at `shape`: forced, recorded, or measured now.

    `runs` maps both names of KERNELS[kernel] to a call that runs that
    implementation once on the real shapes (in the order given for the
    warm-up, so the first may validate the inputs). `shape` names the
    shapes in a file-name-safe key (letters, digits, `_.+-`).
    """
    baseline, alternative = KERNELS[kernel]
    force = forced().get(kernel)
    if force is not None:
        return force
    if not _SHAPE.fullmatch(shape):
        raise ValueError(f"kernel choice {kernel!r}: shape key {shape!r} is not file-name safe")
    directory = _directory()
    known = _read(directory, kernel, shape)
    if known is not None:
        return known.winner
    if not _writable(directory):
        return baseline
    times = _fastest_ms(runs)
    winner = alternative if times[alternative] < times[baseline] * (1 - MARGIN) else baseline
    _write_once(directory, Choice(kernel, shape, winner, tuple(sorted(times.items()))))
    _read.cache_clear()
    known = _read(directory, kernel, shape)
    log.info("kernel %s at %s: %s (%s)", kernel, shape, known.winner if known else winner,
             ", ".join(f"{name} {ms:.3f} ms" for name, ms in sorted(times.items())))
    return known.winner if known is not None else winner


def recorded() -> list[Choice]:
    """Every choice measured on this CPU so far (under the current cache directory), sorted."""
    directory = _directory()
    return [
        choice
        for path in sorted(directory.glob("*/*.json"))
        if (choice := _read(directory, path.parent.name, path.stem)) is not None
    ]


def active() -> dict[str, dict[str, str]]:
    """The choices in force, by kernel then shape; a forced kernel shows as {'*': name}."""
    out: dict[str, dict[str, str]] = {}
    for choice in recorded():
        out.setdefault(choice.kernel, {})[choice.shape] = choice.winner
    for kernel, name in forced().items():
        out[kernel] = {"*": name}
    return out


def machine() -> dict[str, object]:
    """The fields a benchmark record carries: `cpu` (model), `cpu_flags` (vector features), `kernels` (active())."""
    return {"cpu": features.model(), "cpu_flags": list(features.vector_features()), "kernels": active()}


def bucket(count: int) -> int:
    """`count` (a batch, a number of ids) rounded up to a power of two: one calibration covers nearby batch sizes."""
    return 1 << max(count - 1, 0).bit_length()
