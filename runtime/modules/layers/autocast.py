"""Whether this forward runs under bf16 training's autocast (runtime.train.precision) on the CPU.

Blocks with a faster fp32 kernel than autocast's bf16 ops (the dot interaction, attention,
the blocked softmax) ask, to time the two against each other under that precision.
"""

from __future__ import annotations

import torch

__all__ = ["bf16_autocast"]


def bf16_autocast() -> bool:
    """True inside `torch.autocast("cpu", torch.bfloat16)`."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
