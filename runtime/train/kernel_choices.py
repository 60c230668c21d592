"""The kernel choices of a training run: agreed across ranks, kept with its checkpoints, repeated on resume.

runtime/cpu/choice.py fixes each numerics-changing kernel's choice per site
at its first use in the run (`choice.run()`, entered by the worker). Ranks of
one host read the one recorded file per site, so they agree. `share` gives
every rank rank 0's recorded decisions at the start, so ranks whose caches
differ (other hosts) agree on every site rank 0 has measured before; a site
new to all can still be measured apart, and `gather`, which collects every
rank's decisions at a checkpoint save (a collective, as the save is) into the
manifest's "kernels", names it. `restore` pins a checkpoint's decisions on
resume, before the first step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist

from runtime.cpu import choice

__all__ = ["KernelChoices", "gather", "restore", "share"]


def share(process_group: dist.ProcessGroup | None) -> None:
    """Rank 0's recorded per-site decisions, taken by every rank in the current run (a collective)."""
    if process_group is None:
        return
    box = [choice.sites() if dist.get_rank(process_group) == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(process_group, 0), group=process_group)
    choice.know(box[0] or {})


def gather(process_group: dist.ProcessGroup | None) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Every rank's pinned choices, merged by kernel then site, and a line for each site ranks disagree on.

    Where ranks disagree the lowest rank's decision is kept: a resume runs it on every rank.
    """
    mine = choice.pinned()
    if process_group is None:
        return mine, []
    every: list[dict[str, dict[str, str]] | None] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(every, mine, group=process_group)
    merged: dict[str, dict[str, tuple[int, str]]] = {}
    differences = []
    for rank, pins in enumerate(every):
        for kernel, sites in sorted((pins or {}).items()):
            for site, winner in sorted(sites.items()):
                first_rank, first = merged.setdefault(kernel, {}).setdefault(site, (rank, winner))
                if first != winner:
                    differences.append(
                        f"kernel {kernel} at {site}: rank {first_rank} ran {first}, rank {rank} ran {winner} "
                        f"(separate choice caches?); the checkpoint keeps {first}"
                    )
    kept = {kernel: {site: winner for site, (_, winner) in sorted(sites.items())} for kernel, sites in merged.items()}
    return dict(sorted(kept.items())), differences


def restore(manifest: Mapping[str, object]) -> list[str]:
    """Pin the choices a checkpoint's manifest recorded (none in an older one); why any cannot be kept."""
    recorded = manifest.get("kernels")
    if not isinstance(recorded, Mapping):
        return []
    return choice.pin(recorded)


class KernelChoices:
    """The run's kernel choices as a checkpoint's state (its manifest's "kernels": runtime.checkpoint.states).

    `state_dict` gathers every rank's (a collective, as the save is) and `warn`s of each site
    ranks disagree on; `load_state_dict` pins the saved ones, and `load_notes` says, after the
    checkpoint's path, why any cannot be kept.
    """

    def __init__(self, process_group: dist.ProcessGroup | None, warn: Callable[[str], None]) -> None:
        self.process_group = process_group
        self.warn = warn
        self.load_notes: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        kernels, differences = gather(self.process_group)
        for difference in differences:
            self.warn(f"warning: ranks chose kernels differently: {difference}")
        return kernels

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.load_notes = [f": {problem}" for problem in restore({"kernels": state_dict})]
