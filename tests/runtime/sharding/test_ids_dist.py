"""The id all-to-all's helpers (runtime/sharding/ids_dist.py) against plain Python.

The exchange itself is simulated in-process: each rank's packed buffer is
cut by its split sizes and the pieces delivered in source order, as
all_to_all_single does, then unpacked and compared bag by bag.
"""

from __future__ import annotations

import pytest
import torch

from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.sharding.ids_dist import (
    count_message,
    pack_ids,
    read_counts,
    send_splits,
    transpose_index,
    uniform_lengths,
    unpack_ids,
)

SLOTS_PER_RANK = [2, 0, 3]  # rank 1 looks nothing up
BATCH = 3


def test_counts_and_splits() -> None:
    length_per_key = [4, 1, 7, 0, 2]
    assert count_message(BATCH, length_per_key, SLOTS_PER_RANK, True) == [3, 1, 4, 1, 3, 1, 3, 1, 7, 0, 2]
    assert count_message(BATCH, length_per_key, SLOTS_PER_RANK, False) == [3, 0, 4, 1, 3, 0, 3, 0, 7, 0, 2]
    assert send_splits(BATCH, length_per_key, SLOTS_PER_RANK, True) == ([5, 0, 9], [11, 0, 18])
    assert send_splits(BATCH, length_per_key, SLOTS_PER_RANK, False) == ([5, 0, 9], [5, 0, 9])
    assert read_counts([3, 1, 4, 1, 3, 0, 0, 2, 3, 1, 5, 5], local_slots=2) == (
        [3, 3, 3],
        [True, False, True],
        [[4, 1], [0, 2], [5, 5]],
    )


def test_lengths_are_uniform_when_every_bag_of_a_key_holds_its_share() -> None:
    def kjt(lengths: list[int], keys: int = 0) -> KeyedJaggedTensor:
        names = [f"k{i}" for i in range(keys or len(lengths) // 2)]  # batch 2 unless keys are given
        return KeyedJaggedTensor.from_lengths_sync(names, torch.arange(sum(lengths)), torch.tensor(lengths))

    assert uniform_lengths(kjt([2, 2, 1, 1, 0, 0]))
    assert not uniform_lengths(kjt([2, 2, 1, 3]))  # the same total, not the same bags
    assert not uniform_lengths(kjt([2, 2, 1, 2]))
    assert not uniform_lengths(kjt([], keys=2))  # batch 0


def routed_batch(source: int, uniform: bool = False) -> KeyedJaggedTensor:
    """Source `source`'s bags of every slot, destination-major; ids encode source, slot, sample.

    `uniform`: every bag of slot j holds j % 3 ids."""
    gen = torch.Generator().manual_seed(source)
    slots = sum(SLOTS_PER_RANK)
    lengths = torch.randint(0, 3, (slots * BATCH,), generator=gen)
    if uniform:
        lengths = (torch.arange(slots) % 3).repeat_interleave(BATCH)
    ids = [
        1000 * source + 100 * (entry // BATCH) + 10 * (entry % BATCH) + i
        for entry, n in enumerate(lengths.tolist())
        for i in range(n)
    ]
    return KeyedJaggedTensor.from_lengths_sync(
        [f"slot{j}" for j in range(slots)],
        torch.tensor(ids),
        lengths,
        weights=torch.tensor(ids, dtype=torch.float32) / 7,
    )


@pytest.mark.parametrize("uniform", [(False, False, False), (True, True, True), (True, False, True)])
def test_pack_exchange_unpack_gives_each_rank_its_slots_over_the_global_batch(uniform: tuple[bool, ...]) -> None:
    """Sources whose bags are uniform send ids only, as IdsAllToAll does; the others lengths too."""
    world_size = len(SLOTS_PER_RANK)
    sources = [routed_batch(s, uniform[s]) for s in range(world_size)]
    assert [uniform_lengths(kjt) for kjt in sources] == list(uniform)
    packed = [kjt.values() if uniform[s] else pack_ids(kjt, SLOTS_PER_RANK) for s, kjt in enumerate(sources)]
    splits = [send_splits(BATCH, kjt.length_per_key(), SLOTS_PER_RANK, not uniform[s]) for s, kjt in enumerate(sources)]
    first_slot = [sum(SLOTS_PER_RANK[:r]) for r in range(world_size)]
    for rank, local in enumerate(SLOTS_PER_RANK):
        pieces = [piece(packed[s], splits[s][1], rank) for s in range(world_size)]
        weights = torch.cat([piece(sources[s].weights(), splits[s][0], rank) for s in range(world_size)])
        mine = slice(first_slot[rank], first_slot[rank] + local)
        received = [sources[s].length_per_key()[mine] for s in range(world_size)]
        keys = [f"slot{first_slot[rank] + j}" for j in range(local)]
        transpose = transpose_index(world_size, local, weights.device)
        got = unpack_ids(pieces, weights, BATCH, received, keys, transpose, [not u for u in uniform])

        assert got.keys() == keys and got.stride() == world_size * BATCH
        for j, key in enumerate(keys):
            slot = first_slot[rank] + j
            bags = [bag(sources[s], slot, b) for s in range(world_size) for b in range(BATCH)]
            jt = got[key]
            assert jt.lengths().tolist() == [len(x) for x in bags]
            assert jt.values().tolist() == [i for x in bags for i in x]
            torch.testing.assert_close(jt.weights(), jt.values().float() / 7)
        assert got.length_per_key() == got.lengths().view(local, world_size * BATCH).sum(1).tolist()


def piece(buffer: torch.Tensor, splits: list[int], rank: int) -> torch.Tensor:
    start = sum(splits[:rank])
    return buffer[start : start + splits[rank]]


def bag(kjt: KeyedJaggedTensor, slot: int, sample: int) -> list[int]:
    offsets = kjt.offsets().tolist()
    entry = slot * BATCH + sample
    return kjt.values()[offsets[entry] : offsets[entry + 1]].tolist()
