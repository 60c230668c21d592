"""Which world size would fit a model that does not fit its own: the hint of an infeasible plan.

Runs inside Planner.plan, only when placement failed for lack of memory.
It replans the same IR for larger world sizes, keeping the memory per rank
and the host size (several hosts grow by whole hosts), among the world sizes
the spec's global batch divides over (a world size it does not divide could
not train). Feasibility grows with the ranks for any sharding but
table_wise under constraints, so the search doubles its way through the
candidates to the first that fits, then bisects back to the smallest:
a few plans, not one per candidate.

    >>> fitting_hint(lambda n: n >= 3, world_size=1, batch_size=8, step=1)
    '4 ranks would fit (--world-size 4)'
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from compiler.diagnostics import CompileError
from compiler.planner.topology import Topology

# The largest world size a spec may ask for (schema.json's sharding.world_size): planning is linear
# in the ranks, and a batch of 2^31 - 2 samples divides over 2^30 - 1 of them.
MAX_WORLD_SIZE = 65536


def fitting_world_size(
    fits: Callable[[int], bool], world_size: int, batch_size: int, step: int, least: int = 1
) -> int | None:
    """The smallest world size above `world_size` and at least `least` (the tables' bytes over
    a rank's) that `fits`, among the multiples of `step` that divide `batch_size`, up to
    MAX_WORLD_SIZE; None when not even the largest fits."""
    first = max(world_size + 1, least)
    sizes = [n for n in divisors(batch_size) if first <= n <= MAX_WORLD_SIZE and n % step == 0]
    miss, probe = -1, 0  # sizes[miss] does not fit (-1: before the first)
    while True:  # double: probe 0, 1, 3, 7 ... and the last
        if probe >= len(sizes) - 1:
            probe = len(sizes) - 1
        if probe < 0 or (probe == miss):
            return None
        if fits(sizes[probe]):
            break
        miss, probe = probe, 2 * probe + 1
    hit = probe
    while hit - miss > 1:  # bisect: the smallest that fits
        middle = (miss + hit) // 2
        if fits(sizes[middle]):
            hit = middle
        else:
            miss = middle
    return sizes[hit]


def divisors(n: int) -> list[int]:
    """The divisors of `n` >= 1 in increasing order, by trial up to its square root: a batch size of
    2^31 takes 46,341 trials, where trying every number up to it spun for minutes."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def fitting_hint(fits: Callable[[int], bool], world_size: int, batch_size: int, step: int, least: int = 1) -> str:
    """The world size that would fit, or that none would, as the end of a diagnostic."""
    found = fitting_world_size(fits, world_size, batch_size, step, least)
    if found is None:
        return f"no larger world size that the batch size {batch_size} divides over would fit"
    return f"{found} ranks would fit (--world-size {found})"


def grown(topology: Topology, world_size: int, batch_size: int) -> Topology:
    """`topology` with `world_size` ranks: the same memory per rank, host size and bandwidths."""
    per_host = world_size if topology.num_hosts == 1 else topology.ranks_per_host
    return dataclasses.replace(
        topology,
        world_size=world_size,
        ranks_per_host=per_host,
        batch_size_per_rank=max(1, math.ceil(batch_size / world_size)),
    )


def succeeds(attempt: Callable[[], object]) -> bool:
    """Whether `attempt` runs without a CompileError."""
    try:
        attempt()
    except CompileError:
        return False
    return True
