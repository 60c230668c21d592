"""compiler/planner/topology.py: defaults per device, overrides, sizes."""

from __future__ import annotations

import pytest
from planner_ir import T, make_ir

from compiler.diagnostics import CompileError
from compiler.planner.topology import DEVICE_DEFAULTS, GiB, MiB, format_bytes, parse_bytes, topology_from_ir

TABLES = [T("a", 1000, 16)]


def test_defaults_come_from_the_device_kind() -> None:
    for device in ("cpu", "cuda"):
        topology = topology_from_ir(make_ir(TABLES, world_size=4, device=device))
        defaults = DEVICE_DEFAULTS[device]
        assert topology.memory_per_rank == defaults.memory_per_rank
        assert topology.memory_bandwidth == defaults.memory_bandwidth
        assert topology.inter_host_bandwidth == defaults.inter_host_bandwidth
        assert (topology.ranks_per_host, topology.num_hosts) == (4, 1)
    assert topology_from_ir(make_ir(TABLES, device="cpu")).memory_per_rank == 16 * GiB
    assert topology_from_ir(make_ir(TABLES, device="cuda")).memory_per_rank == 32 * GiB


def test_spec_values_and_then_arguments_win() -> None:
    ir = make_ir(TABLES, world_size=8, ranks_per_host=4, memory_per_rank=3 * GiB, batch_size=1000)
    topology = topology_from_ir(ir)
    assert (topology.world_size, topology.ranks_per_host, topology.memory_per_rank) == (8, 4, 3 * GiB)
    assert topology.batch_size_per_rank == 125
    assert topology.host_ranks(1) == (4, 5, 6, 7)
    assert topology.comm_bandwidth == topology.inter_host_bandwidth
    topology = topology_from_ir(ir, world_size=16, ranks_per_host=8, memory_per_rank=GiB)
    assert (topology.world_size, topology.ranks_per_host, topology.memory_per_rank) == (16, 8, GiB)
    assert topology.batch_size_per_rank == 63  # 1000 / 16 rounded up


def test_ranks_per_host_is_capped_at_the_world_size() -> None:
    topology = topology_from_ir(make_ir(TABLES, world_size=8, ranks_per_host=8), world_size=2)
    assert (topology.ranks_per_host, topology.num_hosts) == (2, 1)
    assert topology.comm_bandwidth == topology.intra_host_bandwidth


def test_ranks_per_host_must_divide_the_world_size() -> None:
    with pytest.raises(CompileError) as error:
        topology_from_ir(make_ir(TABLES, world_size=6), ranks_per_host=4)
    assert str(error.value) == (
        "specs/test.yaml:400:3: error: sharding.ranks_per_host: "
        "--ranks-per-host 4 does not divide the world size 6\n1 error"
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("16GiB", 16 * GiB),
        ("16 GiB", 16 * GiB),
        ("16G", 16 * GiB),
        ("2GB", 2 * 10**9),
        ("512MiB", 512 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("1048576", MiB),
        ("100 B", 100),
        ("9223372036854775807", (1 << 63) - 1),
        ("0.1GB", 10**8),  # exact: no float rounding
        ("8388607.99999999999999TiB", 8388607 * 2**40 + 2**40 - 1),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a size such as 16GiB, 512MiB or 1073741824, got ''"),
        ("GiB", "expected a size such as 16GiB, 512MiB or 1073741824, got 'GiB'"),
        ("16 parsecs", "expected a size such as 16GiB, 512MiB or 1073741824, got '16 parsecs'"),
        ("-1GiB", "expected a size such as 16GiB, 512MiB or 1073741824, got '-1GiB'"),
        ("0", "a memory size must be at least 1 byte, got '0'"),
        ("9223372036854775808", "a memory size must be at most 9223372036854775807 bytes, got '9223372036854775808'"),
        ("9" * 400 + "TiB", f"a memory size must be at most 9223372036854775807 bytes, got '{'9' * 400}TiB'"),
    ],
)
def test_parse_bytes_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_bytes(text)
    assert str(error.value) == message


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 512, 1536, 25 * MiB + MiB // 2, 16 * GiB, 38.1 * GiB)] == [
        "0 B",
        "512 B",
        "1.5 KiB",
        "25.5 MiB",
        "16 GiB",
        "38.1 GiB",
    ]
