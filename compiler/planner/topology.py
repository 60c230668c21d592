"""The machine a plan is made for: ranks, hosts, memory and bandwidths.

First stage of the planner: `topology_from_ir` reads the spec's `sharding:`
section, lets the command line override it, and fills the rest from the
defaults of the device kind (`DEVICE_DEFAULTS`, documented in docs/planner.md).
Every later stage reads the `Topology` and nothing else about the machine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import INT64_MAX, Device, ModelIR

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


@dataclass(frozen=True, slots=True)
class DeviceDefaults:
    """What a rank of one device kind has unless the spec or the command line say otherwise."""

    memory_per_rank: int  # bytes for embedding shards (HBM on cuda, DDR on cpu)
    memory_bandwidth: float  # bytes/s: lookups in that memory
    intra_host_bandwidth: float  # bytes/s per rank, between ranks of one host
    inter_host_bandwidth: float  # bytes/s per rank, between hosts


# cuda: a 40 GB-class GPU with room left for dense parameters and activations,
# NVLink inside a host, a 100 Gb/s NIC per GPU between hosts; TorchRec's planner
# uses the same figures. cpu: one DDR channel's worth of bandwidth per rank,
# gloo over shared memory inside a host and 10 Gb/s Ethernet between hosts.
DEVICE_DEFAULTS: dict[str, DeviceDefaults] = {
    "cuda": DeviceDefaults(
        memory_per_rank=32 * GiB,
        memory_bandwidth=897.0 * GiB,
        intra_host_bandwidth=600.0 * GiB,
        inter_host_bandwidth=12.5 * GiB,
    ),
    "cpu": DeviceDefaults(
        memory_per_rank=16 * GiB,
        memory_bandwidth=51.0 * GiB,
        intra_host_bandwidth=10.0 * GiB,
        inter_host_bandwidth=1.25 * GiB,
    ),
}


@dataclass(frozen=True, slots=True)
class Topology:
    """Ranks 0..world_size-1; host h holds ranks h*ranks_per_host .. (h+1)*ranks_per_host-1."""

    world_size: int
    ranks_per_host: int
    device: Device
    memory_per_rank: int  # bytes
    memory_bandwidth: float  # bytes/s
    intra_host_bandwidth: float  # bytes/s
    inter_host_bandwidth: float  # bytes/s
    batch_size_per_rank: int

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.ranks_per_host

    def host_ranks(self, host: int) -> tuple[int, ...]:
        start = host * self.ranks_per_host
        return tuple(range(start, start + self.ranks_per_host))

    @property
    def comm_bandwidth(self) -> float:
        """What an all-to-all over every rank gets: the slowest link it crosses."""
        return self.intra_host_bandwidth if self.num_hosts == 1 else self.inter_host_bandwidth

    def describe(self) -> str:
        hosts = f"{self.num_hosts} host" + ("s" if self.num_hosts != 1 else "")
        return (
            f"{self.world_size} rank{'s' if self.world_size != 1 else ''} on {hosts} ({self.device}), "
            f"{format_bytes(self.memory_per_rank)} per rank, batch {self.batch_size_per_rank} per rank"
        )


def topology_from_ir(
    ir: ModelIR,
    world_size: int | None = None,
    ranks_per_host: int | None = None,
    memory_per_rank: int | None = None,
) -> Topology:
    """The topology of `ir`'s sharding section; non-None arguments (the command line) win.

    The per-rank batch is the training batch divided over the ranks, rounded
    up. Raises CompileError, at the sharding section, when ranks_per_host does
    not divide the world size.
    """
    sharding = ir.sharding
    world = world_size if world_size is not None else sharding.world_size
    per_host = ranks_per_host if ranks_per_host is not None else sharding.ranks_per_host
    per_host = world if per_host is None else min(per_host, world)
    if world % per_host:
        source = "--ranks-per-host" if ranks_per_host is not None else "ranks_per_host"
        raise CompileError(
            [
                Diagnostic(
                    sharding.loc,
                    "sharding.ranks_per_host",
                    f"{source} {per_host} does not divide the world size {world}",
                )
            ]
        )
    defaults = DEVICE_DEFAULTS[sharding.device]
    memory = memory_per_rank if memory_per_rank is not None else sharding.memory_per_rank
    return Topology(
        world_size=world,
        ranks_per_host=per_host,
        device=sharding.device,
        memory_per_rank=memory if memory is not None else defaults.memory_per_rank,
        memory_bandwidth=defaults.memory_bandwidth,
        intra_host_bandwidth=defaults.intra_host_bandwidth,
        inter_host_bandwidth=defaults.inter_host_bandwidth,
        batch_size_per_rank=max(1, math.ceil(ir.training.batch_size / world)),
    )


_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 10**3,
    "m": MiB,
    "mib": MiB,
    "mb": 10**6,
    "g": GiB,
    "gib": GiB,
    "gb": 10**9,
    "t": TiB,
    "tib": TiB,
    "tb": 10**12,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*")


def parse_bytes(text: str) -> int:
    """`16GiB`, `16 G` (binary), `16GB` (decimal), `512MiB`, `1.5TiB` or plain bytes -> bytes."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"expected a size such as 16GiB, 512MiB or 1073741824, got {text!r}")
    value = math.floor(Fraction(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise ValueError(f"a memory size must be at least 1 byte, got {text!r}")
    if value > INT64_MAX:
        raise ValueError(f"a memory size must be at most {INT64_MAX} bytes, got {text!r}")
    return value


def format_bytes(count: float) -> str:
    """Binary units with one decimal, a trailing .0 dropped: `512 B`, `24.4 MiB`, `16 GiB`."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(count) >= size:
            text = f"{count / size:.1f}".removesuffix(".0")
            return f"{text} {unit}"
    return f"{int(count)} B"
