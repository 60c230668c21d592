"""At two ranks the id all-to-all sends its counts beside the data (runtime/sharding/ids_dist.py).

Two ranks move the same routed batches through `IdsAllToAll.start` (the
counts in the data's exchange, padded to the largest piece seen, redone
where one held more) and through `start_counted` (the counts' own exchange
first). The received batches must be equal, with the next step started
before the last is waited for, as the pipeline does; the padded path makes
one exchange a step, two where a piece outgrew the pad (the first step:
nothing is known yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import rendezvous
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.process import shm_exchange
from runtime.sharding.ids_dist import IdsAllToAll
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.train.process_group import close_process_group

SLOTS_PER_RANK = [2, 1]
BATCH = 3
# per step: the most ids a bag holds (0: every bag of slot j holds j % 2 + 1, the lengths stay home)
MOST = [2, 2, 0, 4, 1, 4]


def _routed(rank: int, step: int) -> KeyedJaggedTensor:
    slots = sum(SLOTS_PER_RANK)
    if MOST[step]:
        gen = torch.Generator().manual_seed(10 * step + rank)
        lengths = torch.randint(0, MOST[step] + 1, (slots * BATCH,), generator=gen)
    else:
        lengths = (torch.arange(slots) % 2 + 1).repeat_interleave(BATCH)
    ids = torch.arange(int(lengths.sum())) + 1000 * rank + 100 * step
    return KeyedJaggedTensor.from_lengths_sync([f"slot{j}" for j in range(slots)], ids, lengths)


def _as_lists(kjt: KeyedJaggedTensor) -> dict[str, Any]:
    return {
        "keys": kjt.keys(),
        "lengths": kjt.lengths().tolist(),
        "values": kjt.values().tolist(),
        "stride": kjt.stride(),
    }


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    rendezvous.join_gloo(rank, port)
    local = [f"slot{j}" for j in range(sum(SLOTS_PER_RANK[:rank]), sum(SLOTS_PER_RANK[: rank + 1]))]
    padded = IdsAllToAll(SLOTS_PER_RANK, local, dist.group.WORLD, weighted=False)
    counted = IdsAllToAll(SLOTS_PER_RANK, local, dist.group.WORLD, weighted=False)
    exchanges, original = [0], shm_exchange.all_to_all_single

    def counting(*args: Any, **kwargs: Any) -> Any:
        exchanges[0] += 1
        return original(*args, **kwargs)

    shm_exchange.all_to_all_single = counting  # type: ignore[assignment]
    got, per_step = [], []
    try:
        pending = padded.start(_routed(rank, 0))
        for step in range(len(MOST)):
            before = exchanges[0]
            following = padded.start(_routed(rank, step + 1)) if step + 1 < len(MOST) else None
            got.append(_as_lists(pending.wait()))
            per_step.append(exchanges[0] - before)
            pending = following  # type: ignore[assignment]
    finally:
        shm_exchange.all_to_all_single = original  # type: ignore[assignment]
    expected = [_as_lists(counted.start_counted(_routed(rank, step))[0].wait()) for step in range(len(MOST))]
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, {"got": got, "expected": expected, "exchanges": per_step})
    if rank == 0:
        torch.save(gathered, Path(out) / "ranks.pt")
    close_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ids")
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, str(out)), nprocs=2)
    return torch.load(out / "ranks.pt", weights_only=False)


def test_the_padded_exchange_delivers_what_the_counted_one_does(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["got"] == rank["expected"]
        assert all(step["stride"] == 2 * BATCH for step in rank["got"])


def _grown() -> list[bool]:
    """Per step, whether a piece between the ranks outgrew the pad its exchange started with: the
    largest piece of the steps waited for by then, all but the last (at first the largest
    header). A piece is the counts (the receiver's slots + 2), the lengths unless uniform, the ids."""
    pads, grown = [max(SLOTS_PER_RANK) + 2] * 2, []
    for step in range(len(MOST)):
        pad = pads[step]
        pieces = []
        for source in range(2):
            routed, peer = _routed(source, step), 1 - source
            first = sum(SLOTS_PER_RANK[:peer])
            keys = range(first, first + SLOTS_PER_RANK[peer])
            lengths = SLOTS_PER_RANK[peer] * BATCH if MOST[step] else 0
            pieces.append(SLOTS_PER_RANK[peer] + 2 + lengths + sum(routed.length_per_key()[k] for k in keys))
        grown.append(max(pieces) > pad)
        pads.append(max(pads[-1], *pieces))
    return grown


def test_one_exchange_a_step_two_where_a_piece_outgrew_the_pad(ranks: list[dict[str, Any]]) -> None:
    grown = _grown()
    assert grown[0] and any(grown[1:]) and not all(grown[1:])  # the cases: a redo, and none
    # step k's count also holds step k + 1's padded exchange, started before step k is waited for
    expected = [int(step + 1 < len(MOST)) + int(g) for step, g in enumerate(grown)]
    assert [rank["exchanges"] for rank in ranks] == [expected, expected]
