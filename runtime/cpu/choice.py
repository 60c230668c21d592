"""Choose between two implementations of a kernel by timing both, once per CPU and shape.

Fifteen places in the runtime hold two implementations that compute the same
thing, one on torch's own ops (the baseline, first in `KERNELS`) and one
faster on some CPUs:

    dot         torch (bmm)        | native (runtime/cpu/native/dot_interaction.c)
    linear      aten (F.linear)    | onednn (runtime/modules/layers/linear.py)
    lookup      sequential groups  | concurrent groups (runtime/embeddings/concurrent.py)
    quant_pool  fbgemm             | native (runtime/cpu/native/quant_pool.c)
    pool_team   native on one thread | native on torch's threads, where its own rule
                                     (runtime/cpu/native's IDS_PER_THREAD) would take one
    attention   torch (bmm)        | native (runtime/cpu/native/one_query_attention.c)
    embedding_update  fbgemm's lookup  | native (runtime/cpu/native/quant_pool.c, rowwise_adagrad.c)
    linear_grad_input g W           | g W padded to 8 columns (runtime/modules/layers/padded_grad.py)
    linear_grad_weight mm (g^T x)   | oneDNN's inner-product backward, in the oneDNN
                                     layer's backward (runtime/modules/layers/linear.py)
    packed_mlp  aten (F.linear)    | oneDNN on packed weights, a serving MLP block at a time
                                     (runtime/serving/packed_mlp.py)
    mlp_int8    float (packed_mlp's) | int8 layers, asked only of exports whose dense blocks may
                                     run in int8 (`reccompile export --dense int8`; same module)
    softmax_gemm fp32              | bf16 products, fp32 accumulation (runtime/retrieval/blocked_softmax.py),
                                     asked only under bf16 training (runtime.train.precision)
    attention_precision autocast's bf16 | fp32 (runtime/modules/layers/padded_attention.py),
                                     asked only under bf16 training
    in_batch_softmax torch (blocked GEMMs) | native, one pass over row tiles
                                     (runtime/retrieval/blocked_softmax.py, runtime/cpu/native/in_batch_softmax.c)
    dense_step  the dense optimizer's step on torch's threads | on one thread
                                     (runtime/train/dense_optimizer.py)

The two of a pair may round differently but train the same: every input
that requires a gradient (per-id weights included) gets the same one from
either, and a measurement leaves none behind
(tests/runtime/cpu/test_choice_gradients.py, a case per kernel). The
exceptions are `softmax_gemm` and `attention_precision`, asked only where the
user chose bf16 training: their bf16 sides agree with fp32 within bf16's tolerance;
and `mlp_int8`, asked only of exports the user asked in int8 and never under
autograd, whose int8 side errs as its rounding predicts (tests/runtime/serving/test_int8_mlp.py).

Which is faster depends on the CPU (vector width, cores, cache) and on the
shapes, so at first use `choose` times both on the caller's real shapes:
one warm-up each, then a few interleaved repetitions (for serving's
`packed_mlp`, `mlp_int8`, `quant_pool` and `pool_team`, as many as fill 0.3, 0.3, 0.1 and 0.1 s,
for `in_batch_softmax` 0.2 s and for `dense_step` 0.1 s; see `WINDOWS`), the fastest kept
(a neighbour's preemption only ever adds time,
so the minimum is the least noisy figure of what each path costs). The
alternative is taken only when it beats the baseline's by `MARGIN`, so the
choice is never slower than the torch path it replaces
(`packed_mlp`, two torch paths, takes whichever is faster; see `MARGINS`).
A windowed kernel's measurement during which another process held one of
this process's cores (the free-core probe of runtime/cpu/threads.py over the
window) is used by this process only, not recorded: a stalled thread pool
makes it a coin flip, and a recorded choice sticks.
The outcome is kept on disk next to the native build cache
(`$RECCOMPILE_CACHE_DIR/choices/<cpu>/<calibration>/<kernel>/<shape>.json`),
one file per choice, written once (ranks that measure together all take the
file that landed first). `<calibration>` digests how choices are measured
(`REPEATS`, `WINDOWS`, the margins), what is compared (`KERNELS`: a new
kernel may sit inside another's alternative, as `linear_grad_weight` inside
`linear`'s oneDNN side) and the native kernels' C sources, so a
choice an older reccompile measured another way, or for other kernels, is
measured again instead of trusted for good. A process answers a question it
has asked before from memory (`_memo`, a few microseconds; callers ask at
every forward), keyed also by the variables that name the cache directory;
`run()` empties it.
`reccompile info` lists every recorded choice; `machine()`, for benchmark
records, only the ones this process used.

`RECCOMPILE_KERNELS=dot=torch,linear=onednn` forces a choice per kernel
(tests and benchmarks), without measuring or recording.

Within a training run (`with run():`, entered by the worker), the kernels
whose two implementations round differently (`NUMERIC`) are chosen once per
*site*, not per shape: the caller names the site (a layer, a table group)
without the sizes that vary from batch to batch, the first use decides
(recorded as `<site>_t<threads>.json`, so every rank of the host reads the
one file) and the decision holds for the rest of the run, whatever the
later batches' sizes or a neighbour's load. Ranks with caches of their own
(other hosts) agree through `know()`: rank 0's recorded `sites()`, shared at
the start. `pinned()` lists the run's decisions for its checkpoints and
`pin()` puts a checkpoint's back on resume, so a resumed run computes what
the uninterrupted one did (runtime/train/kernel_choices.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runtime.cpu import features, threads
from runtime.cpu.native.build import SOURCES, cache_root, cache_settings

__all__ = [
    "ENV",
    "KERNELS",
    "MARGIN",
    "MARGINS",
    "NUMERIC",
    "WINDOWS",
    "Choice",
    "Timed",
    "active",
    "bucket",
    "choose",
    "directory",
    "forced",
    "forget_used",
    "know",
    "machine",
    "pin",
    "pinned",
    "recorded",
    "run",
    "sites",
    "unavailable",
    "used",
]

log = logging.getLogger(__name__)

ENV = "RECCOMPILE_KERNELS"
KERNELS: dict[str, tuple[str, str]] = {
    "dot": ("torch", "native"),
    "linear": ("aten", "onednn"),
    "lookup": ("sequential", "concurrent"),
    "quant_pool": ("fbgemm", "native"),
    "pool_team": ("one", "team"),
    "attention": ("torch", "native"),
    "embedding_update": ("fbgemm", "native"),
    "linear_grad_input": ("plain", "padded"),
    "linear_grad_weight": ("mm", "onednn"),
    "packed_mlp": ("aten", "packed"),
    "mlp_int8": ("float", "int8"),
    "softmax_gemm": ("fp32", "bf16"),
    "attention_precision": ("autocast", "fp32"),
    "in_batch_softmax": ("torch", "native"),
    "dense_step": ("team", "one"),
}
# The kernels whose alternatives agree only to rounding (C sums reassociated, oneDNN's GEMM
# blocking): a run must not switch between them, or a resumed run would not repeat the first.
NUMERIC = frozenset(
    {
        "dot",
        "linear",
        "linear_grad_input",
        "linear_grad_weight",
        "attention",
        "embedding_update",
        "softmax_gemm",
        "attention_precision",
        "in_batch_softmax",
    }
)
MARGIN = 0.03  # the alternative must be 3% faster: timing noise alone never moves off the baseline
# Kernels with another margin. Serving's MLP blocks (approximate exports only, never in a training
# run) choose between two torch paths, MKL and oneDNN on packed weights, whose lead swings between
# hosts and days on this project's AVX2 EPYC (packed 4-25% ahead on some, MKL 10% on another): the
# faster measured wins, with no preference either way.
MARGINS: dict[str, float] = {"packed_mlp": 0.0}
REPEATS = 5
# Kernels timed over a window of at least this many seconds (REPEATS interleaved rounds at least).
# oneDNN's packed layers run in fast and slow phases of about 0.1 s on that EPYC (1,130 against
# 1,430 us for 415 -> 512 at batch 512), MKL steadily: five rounds fall inside one phase.
# Serving's pooling takes well under a millisecond a call: five rounds once gave fbgemm 0.744 ms
# against the C kernel's 0.753 for fp16 tables at batch 512, which 200 alternated calls put at 635
# against 287 us.
# The in-batch softmax (5 ms a call at retrieval-bench's shapes, one thread): five rounds on the
# loaded 2-core Zen 4 (load 10-16) once recorded torch's 10.1 ms against the native pass's 12.3,
# which alone takes 4.8 ms there; a window also leaves a measurement under a held core unrecorded.
WINDOWS: dict[str, float] = {
    "packed_mlp": 0.3,
    "mlp_int8": 0.3,
    "quant_pool": 0.1,
    "pool_team": 0.1,
    "in_batch_softmax": 0.2,
    "dense_step": 0.1,
}
_SHAPE = re.compile(r"[A-Za-z0-9_.+-]+")
# Decisions taken from disk or measured, by (kernel, key, cache_root()'s settings): files are written once.
_memo: dict[tuple[str, str, str], str] = {}
# What `choose` times: a mapping of calls, or a function that makes it only when a measurement runs
# (callers ask at every forward; their calls' closures cost microseconds to make).
Runs = Mapping[str, Callable[[], object]] | Callable[[], Mapping[str, Callable[[], object]]]
_used: dict[str, dict[str, str]] = {}  # what this process ran, by kernel then key (machine())
_forced_used: dict[str, str] = {}  # the kernels RECCOMPILE_KERNELS forced when asked, by kernel


@dataclass(frozen=True)
class Choice:
    """One decision: for `kernel` at `shape`, `winner`, from the fastest times in milliseconds.

    `site` is set on the decisions a training run made per site (`shape` is then `<site>_t<threads>`).
    """

    kernel: str
    shape: str
    winner: str
    times_ms: tuple[tuple[str, float], ...]
    site: str | None = None


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


def directory(cache: Path | None = None) -> Path:
    """Where this CPU's choices are recorded under the current calibration (see the module docstring),
    in `cache` (default: the native build's cache_root())."""
    settings = json.dumps([REPEATS, WINDOWS, MARGIN, MARGINS, KERNELS], sort_keys=True)
    calibration = hashlib.sha256(settings.encode() + _sources_digest()).hexdigest()[:12]
    return (cache_root() if cache is None else cache) / "choices" / features.identity() / calibration


@functools.cache
def _sources_digest() -> bytes:
    return hashlib.sha256(b"\0".join(source.read_bytes() for source in SOURCES)).digest()


@functools.lru_cache(maxsize=256)
def _read(root: Path, kernel: str, shape: str) -> Choice | None:
    """The recorded choice, or None if there is none or its file is not a choice of `kernel`."""
    try:
        return _parse((root / kernel / f"{shape}.json").read_bytes(), kernel, shape)
    except OSError:
        return None


def _parse(text: bytes, kernel: str, shape: str) -> Choice | None:
    try:
        data = json.loads(text)  # junk bytes are a UnicodeDecodeError, a ValueError
        winner, times, site = data["winner"], data["times_ms"], data.get("site")
        if winner not in KERNELS[kernel] or not isinstance(times, dict) or not isinstance(site, str | None):
            return None
        return Choice(kernel, shape, winner, tuple((k, float(v)) for k, v in times.items()), site)
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _write_once(root: Path, choice: Choice) -> None:
    """Writes the choice unless a readable one is there already (then that one stands). A file that
    does not read as a choice (a crash mid-write, junk) is moved aside as `<shape>.json.bad` and
    replaced. Raises OSError when the folder cannot be written."""
    folder = root / choice.kernel
    folder.mkdir(parents=True, exist_ok=True)
    site = {} if choice.site is None else {"site": choice.site}
    text = json.dumps(
        {
            "kernel": choice.kernel,
            "shape": choice.shape,
            **site,
            "winner": choice.winner,
            "times_ms": dict(choice.times_ms),
            "cpu": features.model(),
        }
    )
    path = folder / f"{choice.shape}.json"
    handle, scratch = tempfile.mkstemp(dir=folder, suffix=".json.tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # linked only once whole, even across a crash
        os.chmod(scratch, 0o644)  # readable by others sharing the cache, as the kernels are
        for _ in range(2):
            try:
                os.link(scratch, path)
                return
            except FileExistsError:
                if not _move_aside_if_unreadable(path, choice):
                    return
    finally:
        os.unlink(scratch)


def _move_aside_if_unreadable(path: Path, choice: Choice) -> bool:
    """Renames `path` to `<name>.bad` if it does not read as a choice of `choice`'s kernel and shape;
    whether it was unreadable. The file moved is the one read: if another process has replaced it
    since (with a readable choice), that one stands."""
    try:
        with open(path, "rb") as existing:
            if _parse(existing.read(), choice.kernel, choice.shape) is not None:
                return False
            inode = os.fstat(existing.fileno()).st_ino
    except FileNotFoundError:
        return True  # moved aside by another process: link again
    except IsADirectoryError:  # a folder in the file's place: moved aside as a file is
        inode = None
    log.warning("reccompile: kernel choice %s does not read as one; measured again, kept as %s.bad", path, path.name)
    with contextlib.suppress(FileNotFoundError):
        if inode is None or os.stat(path).st_ino == inode:
            os.replace(path, path.with_name(path.name + ".bad"))
    return True


@functools.lru_cache(maxsize=8)
def _writable(root: Path) -> bool:
    """Whether choices can be kept here; if not (warned once), the baselines run unmeasured."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=root).close()
        return True
    except OSError as exc:
        log.warning("reccompile: kernel choices cannot be kept in %s (%s); using the torch baselines", root, exc)
        return False


@dataclass(frozen=True)
class Timed:
    """What a timed call returns when only part of it is the kernel's: the milliseconds that part
    took, timed by the call itself after it prepared the conditions the kernel meets in use."""

    ms: float


def _fastest_ms(runs: Mapping[str, Callable[[], object]], window: float = 0.0) -> dict[str, float]:
    """Each run's fastest time over interleaved calls, after one warm-up call each: REPEATS rounds,
    and more until `window` seconds have passed. A call returning `Timed` gives its own time."""
    for run in runs.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    began = time.perf_counter()
    while len(samples[next(iter(runs))]) < REPEATS or time.perf_counter() - began < window:
        for name, run in runs.items():
            start = time.perf_counter()
            result = run()
            samples[name].append(result.ms if isinstance(result, Timed) else (time.perf_counter() - start) * 1e3)
    return {name: min(times) for name, times in samples.items()}


@dataclass
class _Run:
    """The decisions of the training run in progress, by (kernel, site)."""

    pins: dict[tuple[str, str], str] = field(default_factory=dict)
    known: dict[tuple[str, str], str] = field(default_factory=dict)  # decisions to take at a site's first use


_run: _Run | None = None


@contextlib.contextmanager
def run() -> Iterator[None]:
    """A training run: each NUMERIC kernel's choice per site is fixed at its first use until the end.

    The recorded choices are read afresh from disk at the start (another
    process may have measured since this one last looked).
    """
    global _run
    outer, _run = _run, _Run()
    _read.cache_clear()
    _memo.clear()
    try:
        yield
    finally:
        _run = outer


def sites() -> dict[str, dict[str, str]]:
    """The per-site decisions recorded on this CPU at this thread count, by kernel then site."""
    import torch

    threads, folder = torch.get_num_threads(), directory()
    out: dict[str, dict[str, str]] = {}
    for kernel in sorted(NUMERIC):
        for path in sorted((folder / kernel).glob(f"*_t{threads}.json")):
            made = _read(folder, kernel, path.stem)
            if made is not None and made.site is not None and made.shape == f"{made.site}_t{threads}":
                out.setdefault(kernel, {})[made.site] = made.winner
    return out


def know(decisions: Mapping[str, Mapping[str, str]]) -> None:
    """Take these decisions (rank 0's `sites()`) at each site's first use in the current run, unmeasured."""
    if _run is None:
        raise RuntimeError("kernel choices can only be shared inside choice.run()")
    _run.known.update(
        ((kernel, site), winner)
        for kernel, by_site in decisions.items()
        for site, winner in by_site.items()
        if kernel in KERNELS and winner in KERNELS[kernel]
    )


def pinned() -> dict[str, dict[str, str]]:
    """The decisions the current run has fixed, by kernel then site ({} outside a run)."""
    out: dict[str, dict[str, str]] = {}
    for (kernel, site), winner in sorted(_run.pins.items() if _run is not None else ()):
        out.setdefault(kernel, {})[site] = winner
    return out


def pin(recorded: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Fix these decisions (a checkpoint's `pinned()`) for the rest of the current run.

    Returns a message for each one that cannot be kept here (an unknown
    kernel, an implementation this machine lacks): those fall back to the
    baseline, and the run no longer repeats the one that recorded them.
    """
    if _run is None:
        raise RuntimeError("kernel choices can only be pinned inside choice.run()")
    problems = []
    for kernel, sites in sorted(recorded.items()):
        for site, winner in sorted(sites.items()):
            if kernel not in NUMERIC or winner not in KERNELS[kernel]:
                problems.append(f"kernel choice {kernel}={winner} at {site} is not one this version pins; ignored")
                continue
            baseline = KERNELS[kernel][0]
            missing = unavailable(winner)
            if missing is not None:
                problems.append(
                    f"kernel {kernel} ran {winner} at {site}, which is unavailable here ({missing}); using "
                    f"{baseline}, so this run will not repeat the one that recorded it exactly"
                )
                winner = baseline
            _run.pins[(kernel, site)] = winner
            _used.setdefault(kernel, {})[f"{site}_t{_threads()}"] = winner
    return problems


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def unavailable(name: str) -> str | None:
    """Why implementation `name` cannot run on this machine, or None if it can."""
    if name == "native":
        from runtime.cpu.native import build

        status = build.status()
        return None if status.library is not None else f"native kernels: {status.problem}"
    if name == "onednn":
        import torch

        return None if torch.backends.mkldnn.is_available() else "this torch has no oneDNN"
    return None


def choose(kernel: str, shape: str, runs: Runs, site: str | None = None) -> str:
    """The implementation of `kernel` to use at `shape`: forced, recorded, or measured now.

    `runs` maps both names of KERNELS[kernel] to a call that runs that
    implementation once on the real shapes (in the order given for the
    warm-up, so the first may validate the inputs), or is a function
    returning that mapping, called only if a measurement runs. `shape` names the
    shapes in a file-name-safe key (letters, digits, `_.+-`). `site` names
    the layer or table group in the same way, without the sizes that vary
    per batch: inside `run()`, a NUMERIC kernel is chosen once per site.
    """
    setting = os.environ.get(ENV)  # forced(), without its call: this runs at every forward
    force = _parse_forced(setting).get(kernel) if setting else None
    if force is not None:
        _forced_used[kernel] = force
    if _run is not None and site is not None and kernel in NUMERIC:
        held = _run.pins.get((kernel, site))
        if force is None and held is not None:
            return held
        key = f"{site}_t{_threads()}"
        known = _run.known.get((kernel, site))
        if force is None and known is not None:
            _used.setdefault(kernel, {})[key] = known
        winner = force or known or _decide(kernel, key, runs, site)
        _run.pins[(kernel, site)] = winner
        return winner
    return force if force is not None else _decide(kernel, shape, runs)


def _decide(kernel: str, key: str, runs: Runs, site: str | None = None) -> str:
    """This process's earlier answer for `key` under this cache directory, else `_from_disk`'s."""
    memo_key = (kernel, key, cache_settings())
    winner = _memo.get(memo_key)
    if winner is None:
        winner = _memo[memo_key] = _from_disk(kernel, key, runs, site)
        _used.setdefault(kernel, {})[key] = winner
    return winner


def _from_disk(kernel: str, key: str, runs: Runs, site: str | None) -> str:
    """The recorded choice for `key`, else the one measured now and recorded (the first on disk wins)."""
    baseline, alternative = KERNELS[kernel]
    if not _SHAPE.fullmatch(key):
        raise ValueError(f"kernel choice {kernel!r}: shape key {key!r} is not file-name safe")
    folder = directory()
    known = _read(folder, kernel, key)
    if known is not None:
        return known.winner
    if not _writable(folder):
        return baseline
    before = threads.cpu_sample() if kernel in WINDOWS else None
    times = _fastest_ms(runs() if callable(runs) else runs, WINDOWS.get(kernel, 0.0))
    margin = MARGINS.get(kernel, MARGIN)
    winner = alternative if times[alternative] < times[baseline] * (1 - margin) else baseline
    if before is not None and _core_held_since(before):
        log.info(
            "kernel %s at %s: %s for this process only, not recorded: another process held a core (%s)",
            kernel,
            key,
            winner,
            ", ".join(f"{name} {ms:.3f} ms" for name, ms in sorted(times.items())),
        )
        return winner
    try:
        _write_once(folder, Choice(kernel, key, winner, tuple(sorted(times.items())), site))
    except OSError as exc:  # a full disk, a file where a folder should be: this process keeps its measurement
        log.warning(
            "reccompile: kernel choice %s at %s cannot be recorded in %s (%s); this process uses %s",
            kernel,
            key,
            folder,
            exc,
            winner,
        )
        return winner
    _read.cache_clear()
    known = _read(folder, kernel, key)
    log.info(
        "kernel %s at %s: %s (%s)",
        kernel,
        key,
        known.winner if known else winner,
        ", ".join(f"{name} {ms:.3f} ms" for name, ms in sorted(times.items())),
    )
    return known.winner if known is not None else winner


def _core_held_since(before: threads.CpuSample) -> bool:
    """Whether another process held one of this process's cores since `before` (free-core probe)."""
    after = threads.cpu_sample()
    if after is None:
        return False
    idle = threads.idle_over_windows([before, after], os.cpu_count() or 1, 1.0 / os.sysconf("SC_CLK_TCK"))
    return idle is not None and round(idle) < len(os.sched_getaffinity(0))


def recorded() -> list[Choice]:
    """Every choice measured on this CPU so far (under the current cache directory), sorted."""
    folder = directory()
    return [
        choice
        for path in sorted(folder.glob("*/*.json"))
        if (choice := _read(folder, path.parent.name, path.stem)) is not None
    ]


def active() -> dict[str, dict[str, str]]:
    """The choices in force, by kernel then shape; a forced kernel shows as {'*': name}."""
    out: dict[str, dict[str, str]] = {}
    for choice in recorded():
        out.setdefault(choice.kernel, {})[choice.shape] = choice.winner
    for kernel, name in forced().items():
        out[kernel] = {"*": name}
    return out


def used() -> dict[str, dict[str, str]]:
    """The choices this process has run, by kernel then shape (site key in a run); a forced kernel as {'*': name}.

    Unlike `active()`, this names only what the process asked for, not every
    choice the cache directory has accumulated.
    """
    out = {kernel: dict(sorted(by_key.items())) for kernel, by_key in sorted(_used.items())}
    for kernel, name in sorted(_forced_used.items()):
        out[kernel] = {"*": name}
    return out


def forget_used() -> None:
    """Start `used()` afresh, for a benchmark measuring several models in one process.

    The memo goes too, so that each choice asked again is noted again.
    """
    _used.clear()
    _forced_used.clear()
    _memo.clear()


def machine() -> dict[str, object]:
    """The fields a benchmark record carries: `cpu` (model), `cpu_flags` (vector features), `kernels` (used())."""
    return {"cpu": features.model(), "cpu_flags": list(features.vector_features()), "kernels": used()}


def bucket(count: int) -> int:
    """`count` (a batch, a number of ids) rounded up to a power of two: one calibration covers nearby batch sizes."""
    return 1 << max(count - 1, 0).bit_length()
