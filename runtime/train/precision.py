"""Mixed precision for training: the dense layers in bf16, everything else as it was.

`bf16` runs the forward (and so the backward) of the dense layers under
`torch.autocast("cpu", torch.bfloat16)`: matrix products take bf16 copies of
their fp32 inputs and weights, while the weights themselves, their
gradients, the dense optimizer's state, the embedding tables and their fused
optimizer stay fp32 (the tables' lookups are not autocast ops; the losses
run in fp32 by autocast's own rules). It only pays where the CPU computes in
bf16 natively (avx512_bf16, AMX, Arm's bf16); elsewhere autocast emulates
bf16 slower than fp32, so training refuses it there, naming the CPU. The
refusal happens where the CPU is known: on the training worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

# torch-free, as this module's import: `reccompile check` uses it
from runtime.cpu import features

__all__ = ["BF16_FLAGS", "PRECISIONS", "PrecisionError", "autocast", "bf16_supported", "check_precision"]

PRECISIONS = ("fp32", "bf16")
# runtime.cpu.features.vector_features() names of native bf16 arithmetic
BF16_FLAGS = ("avx512bf16", "amx-bf16", "bf16")


class PrecisionError(ValueError):
    """The precision asked for cannot run here; the message is one line for the user."""


def bf16_supported(flags: Sequence[str] | None = None) -> bool:
    """Whether the CPU (its `vector_features()`, or `flags`) computes in bf16 natively."""
    flags = features.vector_features() if flags is None else flags
    return any(flag in flags for flag in BF16_FLAGS)


def check_precision(precision: str, device: str = "cpu", flags: Sequence[str] | None = None, where: str = "") -> None:
    """Raises PrecisionError when `precision` is unknown, or bf16 on a CPU without bf16 arithmetic;
    `where` (the spec location) starts the message."""
    at = f"{where}: " if where else ""
    if precision not in PRECISIONS:
        raise PrecisionError(f"{at}training precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "bf16" and device == "cpu" and not bf16_supported(flags):
        raise PrecisionError(
            f"{at}training precision bf16 needs a CPU with bf16 arithmetic ({', '.join(BF16_FLAGS)}); "
            f"this one ({features.model()}) has none: train in fp32"
        )


@contextlib.contextmanager
def autocast(precision: str, device: str = "cpu") -> Iterator[None]:
    """The dense computation of a forward in `precision` (fp32: nothing changes)."""
    if precision == "fp32":
        yield
        return
    import torch

    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        yield
