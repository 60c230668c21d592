"""Rendezvous ports for tests that start ranks, safe while other tests run at once (pytest-xdist).

Binding port 0, closing the socket and handing its number to rank 0 leaves a
window in which any other process may take the port: gloo's listeners and
every outgoing connection get their ports from the same ephemeral range. With
two test files running at once, a test's rank 0 then fails to bind its store.

- `hosted_store()`: the test process hosts the ranks' TCP store on a port the
  kernel picks, bound until the ranks are done; each rank joins it as a
  client through `client()` (`join_gloo()` for two gloo ranks). No window at all.
- `launcher_port()`: for a launcher that binds the port itself (torchrun's
  c10d rendezvous), a free port below the ephemeral range, which the kernel
  never hands out on its own; only another explicit choice could take it.
"""

from __future__ import annotations

import contextlib
import datetime
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

HOST = "127.0.0.1"
# Below this, ports belong to well-known services.
FIRST_REGISTERED_PORT = 1024


@contextlib.contextmanager
def hosted_store() -> Iterator[int]:
    """The port of a TCP store this process hosts for the ranks' rendezvous, open within the block."""
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    try:
        yield store.port
    finally:
        del store


def join_gloo(rank: int, port: int) -> None:
    """Rank `rank` of two joins a gloo process group through the store at `port` (60 s timeouts), by the
    runtime's `init_process_group` (nothing in torch left holding the group)."""
    from runtime.train.process_group import init_process_group

    timeout = datetime.timedelta(seconds=60)
    init_process_group(backend="gloo", store=client(port, 2, timeout), rank=rank, world_size=2, timeout=timeout)


def client(port: int, world_size: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """A rank's connection to the store `hosted_store()` opened at `port`, for `init_process_group(store=)`."""
    return dist.TCPStore(HOST, port, world_size, is_master=False, timeout=timeout)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except OSError:
        return 32768, 60999  # Linux's default range


def launcher_port() -> int:
    """A port free now and outside the kernel's ephemeral range, for a launcher that binds it itself."""
    low, _ = _ephemeral_range()
    while True:
        port = random.randrange(FIRST_REGISTERED_PORT + 1000, low)
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        return port
