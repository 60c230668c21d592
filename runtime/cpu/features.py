"""What CPU this is: its model name and the vector features the kernels care about.

Read once from `lscpu` and /proc/cpuinfo (Linux), with `platform` as the
fallback elsewhere. Kernel choices are cached per `identity()`, and the
benchmarks and `reccompile info` print `model()` and `vector_features()`, so
figures from different machines are never compared blind.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import shutil
import subprocess

__all__ = ["identity", "model", "vector_features"]

# /proc/cpuinfo flag -> the name printed (x86 "flags", aarch64 "Features").
_VECTOR_FLAGS = {
    "sse4_2": "sse4.2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512_vnni": "avx512vnni",
    "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16",
    "avx_vnni": "avxvnni",
    "amx_tile": "amx",
    "amx_bf16": "amx-bf16",
    "amx_int8": "amx-int8",
    "asimd": "neon",
    "asimdhp": "neon-fp16",
    "asimddp": "neon-dotprod",
    "sve": "sve",
    "sve2": "sve2",
    "bf16": "bf16",
    "i8mm": "i8mm",
}


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first value of each key in /proc/cpuinfo (one core's description)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


@functools.cache
def model() -> str:
    """The CPU's model name as `lscpu` prints it (e.g. 'AMD EPYC'), else /proc/cpuinfo's, else platform's."""
    lscpu = shutil.which("lscpu")
    if lscpu:
        done = subprocess.run([lscpu], capture_output=True, text=True, check=False, env={"LC_ALL": "C"})
        for line in done.stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name" and value.strip():
                return value.strip()
    info = _cpuinfo()
    return info.get("model name") or info.get("CPU part") or platform.processor() or platform.machine()


@functools.cache
def vector_features() -> tuple[str, ...]:
    """The vector features of this CPU, in a fixed order (e.g. ('avx', 'avx2', 'fma', 'f16c'))."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return tuple(name for flag, name in _VECTOR_FLAGS.items() if flag in flags)


@functools.cache
def identity() -> str:
    """A short stable key for this CPU: machine, model and every feature flag."""
    info = _cpuinfo()
    text = "\0".join((platform.machine(), model(), info.get("flags") or info.get("Features") or ""))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
