"""The shared-memory all-to-all (runtime/process/shm_exchange.py) against gloo's, on two ranks.

One spawned job runs every case and gathers what each rank saw:

- the same ops through both transports give the same bits: dtypes, empty
  pieces, uneven splits, rows of several columns, pieces that outgrow a
  buffer's file, several ops in flight waited for in reverse order; no file
  is left in the exchange's folder afterwards;
- 40 ops in flight unwaited, and more ops than the control has entries;
- ranks that disagree on the split sizes get an error naming both, where
  gloo would abort or truncate;
- a setup that cannot create its control file fails on every rank with the
  reason (`shm`), or falls back to gloo (`auto`);
- a peer that closes its exchange while a rank waits for it: the waiting
  rank fails at once, naming it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import rendezvous
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.process import shm_exchange
from runtime.train.process_group import close_process_group

# (dtype, columns, split sizes sent by rank 0, by rank 1): rank r's output splits are column r.
CASES = [
    (torch.float32, 1, [3, 5], [4, 0]),
    (torch.int64, 1, [0, 0], [0, 7]),
    (torch.float64, 4, [2, 1], [1, 2]),
    (torch.bool, 1, [6, 9], [5, 5]),
    (torch.float32, 3, [1000, 70000], [90000, 1]),  # outgrows the files of the first cases' slots
    (torch.int32, 1, [2, 3], [3, 2]),
]


def _input(rank: int, dtype: torch.dtype, columns: int, sent: list[int], case: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * case + rank)
    values = torch.randn(sum(sent), columns, generator=gen) * 1000
    return values.to(dtype) if dtype != torch.bool else values > 0


def _exchange(transport: Any, rank: int, gloo: bool) -> list[torch.Tensor]:
    """Every case at once, waited for in reverse order (each case twice: once through gloo)."""
    pending = []
    for case, (dtype, columns, *splits) in enumerate(CASES):
        sent = splits[rank]
        received = [splits[source][rank] for source in range(2)]
        values = _input(rank, dtype, columns, sent, case)
        output = torch.empty(sum(received), columns, dtype=dtype)
        if gloo:
            work = dist.all_to_all_single(output, values, received, sent, async_op=True)
        else:
            work = transport.start(output, values, received, sent)
        pending.append((work, output))
    for work, _ in reversed(pending):
        work.wait()
    return [output for _, output in pending]


def _run(rank: int, port: int, folder: str, out: str) -> None:
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
    group = dist.group.WORLD
    seen: dict[str, Any] = {"pid": os.getpid()}
    transport = shm_exchange.setup(group, "shm", folder)
    seen["same"] = [
        torch.equal(a, b)
        for _ in range(3)  # the slots are reused, the later rounds in grown files
        for a, b in zip(_exchange(transport, rank, gloo=False), _exchange(None, rank, gloo=True), strict=True)
    ]
    many = [torch.full((2,), 1000.0 * rank + op) for op in range(40)]  # more in flight than a rank has buffers
    outputs = [torch.empty(2) for _ in many]
    pending = [transport.start(output, values, None, None) for output, values in zip(outputs, many, strict=True)]
    for work in reversed(pending):
        work.wait()
    seen["many"] = [output.tolist() for output in outputs]
    seen["buffers in flight"] = [len(pool) for pool in transport._pools]
    for op in range(shm_exchange.ENTRIES + 8):  # every entry reused
        output = torch.empty(2)
        transport.start(output, torch.full((2,), 7.0 * op + rank), None, None).wait()
    seen["reused"] = output.tolist()
    seen["buffers"] = [len(pool) for pool in transport._pools]
    dist.barrier()
    seen["files"] = sorted(os.listdir(folder))
    try:  # rank 0 sends 3 values to rank 1, which expects 4
        output, values = torch.empty(4 * rank), torch.zeros(3 * (1 - rank))
        transport.start(output, values, [4 * rank, 0], [0, 3 * (1 - rank)]).wait()
    except shm_exchange.ExchangeError as e:
        seen["split error"] = str(e)
    transport.close()
    try:
        shm_exchange.setup(group, "shm", os.path.join(folder, "missing"))
    except shm_exchange.ExchangeError as e:
        seen["setup error"] = str(e)
    seen["auto"] = shm_exchange.setup(group, "auto", os.path.join(folder, "missing"))
    seen["gloo"] = shm_exchange.setup(group, "gloo", folder)
    transport = shm_exchange.setup(group, "shm", folder)
    if rank == 1:
        dist.barrier()  # rank 0 is about to wait on it
        transport.close()
    else:
        dist.barrier()
        try:
            transport.start(torch.empty(2), torch.zeros(2), [1, 1], [1, 1]).wait()
        except shm_exchange.ExchangeError as e:
            seen["peer error"] = str(e)
        transport.close()
    dist.barrier()
    seen["files at the end"] = sorted(os.listdir(folder))
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, seen)
    if rank == 0:
        torch.save(gathered, Path(out) / "seen.pt")
    close_process_group()


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    folder, out = tmp_path_factory.mktemp("shm"), tmp_path_factory.mktemp("out")
    with rendezvous.hosted_store() as port:
        mp.spawn(_run, args=(port, str(folder), str(out)), nprocs=2)
    return torch.load(out / "seen.pt")


def test_shared_memory_moves_the_same_bits_as_gloo(seen: list[dict[str, Any]]) -> None:
    for rank in range(2):
        assert seen[rank]["same"] == [True] * (3 * len(CASES))
        assert seen[rank]["files"] == [], "a piece's file outlived its exchange"


def test_ops_in_flight_are_not_bounded_and_buffers_are_reused(seen: list[dict[str, Any]]) -> None:
    for rank in range(2):
        assert seen[rank]["many"] == [[op + 0.0, 1000.0 + op] for op in range(40)]
        op = shm_exchange.ENTRIES + 7
        assert seen[rank]["reused"] == [7.0 * op, 7.0 * op + 1]
        # a buffer for each op in flight at once (and those of earlier ops not yet consumed then),
        # reused by all the later ones; none to itself. One more at most: the first op after the 40
        # may be posted before the peer has copied out the last of them (its wait needs only the
        # peer's post), and every later one finds that peer done with all 40.
        in_flight, after = seen[rank]["buffers in flight"], seen[rank]["buffers"]
        assert 40 <= in_flight[1 - rank] <= 40 + len(CASES)
        assert in_flight[1 - rank] <= after[1 - rank] <= in_flight[1 - rank] + 1
        assert in_flight[rank] == after[rank] == 0


def test_ranks_that_disagree_on_the_splits_are_told(seen: list[dict[str, Any]]) -> None:
    assert seen[1]["split error"] == (
        "rank 0 sent 12 bytes to rank 1, which expects 16: the ranks disagree on the all-to-all's split sizes"
    )


def test_a_setup_that_cannot_create_its_file_fails_on_every_rank_or_falls_back(
    seen: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    for rank in range(2):
        message = re.sub(r"reccompile-a2a-\d+-[0-9a-f]+", "TOKEN", seen[rank]["setup error"])
        assert message.endswith("/missing/TOKEN: No such file or directory")
        assert message.startswith("the shared-memory exchange could not be set up: rank 0 cannot create /")
        assert seen[rank]["auto"] is None and seen[rank]["gloo"] is None


def test_a_peer_that_leaves_is_named_at_once(seen: list[dict[str, Any]]) -> None:
    assert seen[0]["peer error"] == (
        f"rank 1 (pid {seen[1]['pid']}) left the shared-memory exchange while rank 0 waited for it to send its data"
    )
    assert seen[0]["files at the end"] == [] and seen[1]["files at the end"] == []


def test_shared_memory_only_between_ranks_of_one_linux_x86_host() -> None:
    linux = "Linux/x86_64"
    assert shm_exchange.shared_memory_refusal(["a/1", "a/1"], [linux, linux]) is None
    assert shm_exchange.shared_memory_refusal(["a/1", "b/1"], [linux, linux]) == "the ranks run on 2 hosts"
    assert shm_exchange.shared_memory_refusal(["a/1", "a/1"], [linux, "Linux/aarch64"]) == (
        "shared memory is used on Linux x86-64 only (a rank runs on ['Linux/aarch64', 'Linux/x86_64'])"
    )


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(shm_exchange.ExchangeError, match=r"^RECCOMPILE_EXCHANGE='tcp': expected auto, gloo or shm$"):
        shm_exchange.setup(None, "tcp", "/dev/shm")  # type: ignore[arg-type]


def test_a_sweep_unlinks_only_old_files_of_a_gone_rank_zero(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, live = int(gone.stdout), os.getpid()
    names = [
        f"reccompile-a2a-{dead}-0123456789ab-0-1-12-0",  # all ranks killed after a post: swept
        f"reccompile-a2a-{dead}-0123456789ab",  # its control file: swept
        f"reccompile-a2a-{live}-ba9876543210-1-0-3-0",  # a running exchange's: kept
        "reccompile-a2a-notapid-0-1-0-0",  # not an exchange's name: kept
        f"other-{dead}",  # not ours: kept
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * 4096)
    now = (tmp_path / names[0]).stat().st_ctime
    assert shm_exchange.sweep(str(tmp_path), now=now + shm_exchange.STALE_S / 2) == []
    swept = shm_exchange.sweep(str(tmp_path), now=now + shm_exchange.STALE_S + 1)
    assert sorted(swept) == sorted(names[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    assert shm_exchange.sweep(str(tmp_path / "missing"), now=now) == []
