"""The largest numbers a user may type for a batch size, a seed and threads (flags and spec alike).

A number above them is a typo, refused with its range before anything is
sized by it: a batch's jagged offsets are int32, torch's generators take a
signed 64-bit seed, torch's thread count is a C int, and processes and
batches in flight each hold memory. Torch-free, so the
commands check their flags before torch loads; compiler/spec/schema.json
states the same bounds for the spec's `training` section (a test holds them
to these).
"""

from __future__ import annotations

MAX_BATCH_SIZE = 2**31 - 1
MAX_SEED = 2**63 - 1
MAX_THREADS = 4096
MAX_PROCESSES = 64  # DataLoader or parse processes: each a Python with torch loaded, ~250 MB
MAX_PIPELINE_DEPTH = 64  # batches staged ahead, each held in memory until trained
MAX_RANKS_PER_HOST = 1024  # --nproc: torchrun starts that many processes on this host


def range_problem(flag: str, value: int, least: int, most: int) -> str | None:
    """Why `value` cannot be given to `flag`, or None."""
    if least <= value <= most:
        return None
    return f"{flag} must be between {least:,} and {most:,}, got {value}"
