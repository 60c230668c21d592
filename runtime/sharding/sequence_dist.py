"""The output_dist of sequence groups: looked-up rows back to their samples' ranks.

The lookup on rank o holds, for every source rank s, the rows of the ids s
sent to o's slots (sequence_group.SequenceShards, flat in [source][slot]
order). `SequenceOutputDist` returns them in one all_to_all_single whose
split sizes differ both ways and per batch: o sends s `received[s][j] *
cols_j` values per slot j, and s expects from o what it sent to o's slots,
`sent[t] * cols_t`; both are known from input_dist's counts exchange, so
this stage needs no further sync. Backward runs the same exchange the other
way and divides by the world size (pooled_dist.all_to_all_pooled, for the
reason given there).

The receiver cuts the buffer into one block per routed slot (rows x cols)
and builds each key's rows, the local samples' in their order:

- table_wise: the key's one slot block;
- column_wise: the key's column blocks side by side, in column order;
- row_wise: every id went to the one shard holding its row, so the key's
  blocks together hold each id once; `RoutedSequences.positions` puts them
  back at their ids' places;
- data_parallel (data_parallel.py): no exchange forward; the rank keeps its
  own samples' block of the replica's rows, as for bags.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from runtime.sparse.jagged import JaggedTensor
from runtime.sharding.awaitable import Awaitable
from runtime.sharding.layout import Slot
from runtime.sharding.pooled_dist import all_to_all_pooled
from runtime.sharding.sequence_group import RoutedSequences, SequenceShards


class KeyRows:
    """Builds each key's JaggedTensor from one block of rows per slot (see the module docstring).

    `slots` are the blocks' slots in block order; `by_position`: row_wise,
    else the blocks of a key are column shards (or one whole table).
    """

    def __init__(self, keys: Sequence[str], slots: Sequence[Slot], by_position: bool) -> None:
        self.keys = list(keys)
        self._by_position = by_position
        self._cols = [slot.shard.cols for slot in slots]
        self._key_slots = []
        for k in range(len(self.keys)):
            mine = [t for t, slot in enumerate(slots) if slot.key_index == k]
            if not by_position:
                mine.sort(key=lambda t: slots[t].shard.col_offset)
            self._key_slots.append(mine)

    def block_sizes(self, counts: Sequence[int]) -> list[int]:
        """Values in each slot's block, given each slot's ids."""
        return [n * cols for n, cols in zip(counts, self._cols)]

    def __call__(self, flat: torch.Tensor, counts: Sequence[int], routed: RoutedSequences) -> dict[str, JaggedTensor]:
        blocks = [
            block.view(n, cols) for block, n, cols in zip(flat.split(self.block_sizes(counts)), counts, self._cols)
        ]
        lengths = routed.lengths.view(len(self.keys), routed.batch_size)
        out, first = {}, 0
        for k, key in enumerate(self.keys):
            mine = [blocks[t] for t in self._key_slots[k]]
            if self._by_position:
                assert routed.positions is not None
                ids = sum(counts[t] for t in self._key_slots[k])
                rows = torch.cat(mine) if len(mine) > 1 else mine[0]
                rows = rows.index_select(0, routed.positions[first : first + ids])
                first += ids
            else:
                rows = torch.cat(mine, dim=1) if len(mine) > 1 else mine[0]
            out[key] = JaggedTensor(rows, lengths=lengths[k])
        return out


class SequenceOutputDist(nn.Module):
    """Rows back to their samples' ranks, one JaggedTensor per key (see the module docstring)."""

    def __init__(
        self,
        keys: Sequence[str],
        slots_by_rank: Sequence[Sequence[Slot]],
        rank: int,
        process_group: dist.ProcessGroup,
        by_position: bool,
    ) -> None:
        super().__init__()
        self.keys = list(keys)
        routed = [slot for rank_slots in slots_by_rank for slot in rank_slots]
        self._rows = KeyRows(keys, routed, by_position)
        self._slots_per_rank = [len(rank_slots) for rank_slots in slots_by_rank]
        self._local_cols = [slot.shard.cols for slot in slots_by_rank[rank]]
        self._group = process_group

    def forward(self, shards: SequenceShards) -> Awaitable[dict[str, JaggedTensor]]:
        routed = shards.routed
        sent = [sum(n * c for n, c in zip(row, self._local_cols)) for row in routed.received]
        per_slot = self._rows.block_sizes(routed.sent)
        received, first = [], 0
        for slots in self._slots_per_rank:
            received.append(sum(per_slot[first : first + slots]))
            first += slots
        pending = all_to_all_pooled(shards.values, sent, received, self._group)
        return Awaitable(lambda: self._rows(pending.wait(), routed.sent, routed))
