"""`reccompile info`: this machine as the runtime sees it.

The CPU's model and vector features, the torch and fbgemm_gpu versions and
threads, whether the native kernels built here (and why not), and every
kernel choice measured so far (runtime/cpu/choice.py) with its times, so a
figure can be read against the machine and the kernels that produced it.
"""

from __future__ import annotations

import argparse
import platform

__all__ = ["add_arguments", "report", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def report() -> list[str]:
    """The lines `reccompile info` prints; a bad RECCOMPILE_KERNELS raises ValueError."""
    import fbgemm_gpu
    import torch

    from runtime.cpu import choice, features
    from runtime.cpu.native import build

    outcome = build.status()
    if outcome.library is None:
        native = f"unavailable: {outcome.problem}"
    else:
        native = f"built ({outcome.path or outcome.note})"
    forced = choice.forced()
    lines = [
        f"cpu: {features.model()} ({platform.machine()})",
        f"vector features: {' '.join(features.vector_features()) or 'none'}",
        f"torch {torch.__version__}, fbgemm_gpu {getattr(fbgemm_gpu, '__version__', 'unknown')}, "
        f"{torch.get_num_threads()} threads",
        f"native kernels: {native}",
        f"kernel choices (measured on this CPU, in {choice.directory()}):",
    ]
    made = choice.recorded()
    for made_choice in made:
        times = ", ".join(f"{name} {ms:.2f} ms" for name, ms in made_choice.times_ms)
        lines.append(f"  {made_choice.kernel:<10} {made_choice.shape:<48} {made_choice.winner:<10} ({times})")
    if not made:
        lines.append("  none yet: each is measured at its first use")
    if forced:
        lines.append(f"forced by {choice.ENV}: " + ", ".join(f"{k}={v}" for k, v in sorted(forced.items())))
        for kernel, name in sorted(forced.items()):
            missing = choice.unavailable(name)
            if missing is not None:
                lines.append(
                    f"  {kernel}={name} is unavailable here ({missing}): {kernel} runs {choice.KERNELS[kernel][0]}"
                )
    return lines


def run(args: argparse.Namespace) -> int:
    del args
    try:
        lines = report()
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    print("\n".join(lines))
    return 0
