"""The input side every sharding type over several ranks shares, ending in the id all-to-all.

`id_check` checks the batch and its ids against their tables on the rank
that read them (runtime/embeddings/ids.py), `FeatureSelection` picks a
group's features out of it (one fbgemm permute), and `IdsAllToAll` sends the
bags to the ranks that look them up. The caller hands it a KeyedJaggedTensor already routed: keys grouped by
destination rank (rank 0's slots first, each rank's in its slot order, see
layout.py), each key one slot. Two collectives move it:

1. counts: one small all_to_all_single of [batch size, whether lengths
   follow, ids of each slot] per destination, waited for at once. It gives
   the split sizes of the next collective, so its wait is the one host sync
   of input_dist.
2. data: one all_to_all_single of lengths and ids together (lengths cast to
   the ids' dtype) and, for weighted ids, one of the weights, both async;
   the lookup waits for them. Where every bag of each slot a rank sends
   holds the same number of ids (fixed `ids_per_sample`, multi-hot or one),
   the counts say so and the lengths stay home: that rank sends its ids as
   they lie, with no copy, and the receiver rebuilds the lengths from the
   counts (ids of the slot / batch size).

At two ranks, for unweighted ids, `start` folds the counts into the data
(the scheme of runtime/retrieval/gather.py's PaddedCounts): each rank sends
its peer one piece of a size both agree on beforehand (the largest piece of
the exchanges waited for so far, header included), the counts first, then
its lengths and ids, cut or padded to it. Both ranks see both pieces'
counts, so both know alike when one held more, and then both redo the
exchange at the sizes the counts give (the first two steps do: nothing is
known yet when the pipeline starts the second).
So a step's input_dist is one exchange, waited for by the lookup, with no
host sync at its start, where the counts' exchange waited on the slower
rank. Beyond two ranks a piece's counts are known only to its two ends,
and a weighted batch's weights need the counts first: both keep the two
collectives above.

A receiver gets, from each source rank s, its slots' lengths and ids; one
fbgemm permute turns [source][slot][sample] into [slot][source][sample] (ids
without lengths: one concatenation of each slot's runs where they lie), so
the lookup sees each slot as one list of bags over the global batch (rank
0's samples first), with stride world_size * batch_size.
"""

from __future__ import annotations

from typing import Sequence

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from runtime.embeddings.ids import IdCheck
from runtime.sparse.jagged import KeyedJaggedTensor, KeySelection
from runtime.process import shm_exchange
from runtime.sharding.awaitable import Awaitable


def count_message(
    batch_size: int, length_per_key: Sequence[int], slots_per_rank: Sequence[int], with_lengths: bool
) -> list[int]:
    """[batch size, whether lengths follow (1 or 0), ids of each of its slots] for every destination, concatenated."""
    message: list[int] = []
    first = 0
    for slots in slots_per_rank:
        message.extend((batch_size, int(with_lengths)))
        message.extend(length_per_key[first : first + slots])
        first += slots
    return message


def send_splits(
    batch_size: int, length_per_key: Sequence[int], slots_per_rank: Sequence[int], with_lengths: bool
) -> tuple[list[int], list[int]]:
    """(ids, lengths (unless not `with_lengths`) + ids) sent to each destination."""
    ids, first = [], 0
    for slots in slots_per_rank:
        ids.append(sum(length_per_key[first : first + slots]))
        first += slots
    return ids, [slots * batch_size * with_lengths + n for slots, n in zip(slots_per_rank, ids)]


def read_counts(received: Sequence[int], local_slots: int) -> tuple[list[int], list[bool], list[list[int]]]:
    """(batch size of each source, whether its lengths follow, ids of each local slot from it) from the counts."""
    step = local_slots + 2
    rows = [list(received[i : i + step]) for i in range(0, len(received), step)]
    return [row[0] for row in rows], [bool(row[1]) for row in rows], [row[2:] for row in rows]


def uniform_lengths(features: KeyedJaggedTensor) -> bool:
    """Whether every bag of each key holds the same number of ids (its ids / the batch size).

    Then the lengths follow from the counts alone; a batch of size 0 sends its (no) lengths.
    """
    batch, length_per_key = features.stride(), features.length_per_key()
    if batch == 0 or any(n % batch for n in length_per_key):
        return False
    per_bag = torch.tensor([n // batch for n in length_per_key], dtype=features.lengths().dtype)
    lengths = features.lengths().view(len(length_per_key), batch)
    return bool(torch.equal(lengths, per_bag.to(lengths.device).unsqueeze(1).expand_as(lengths)))


class FeatureSelection:
    """The keys `wanted` (repeats allowed) of a batch, in that order: one fbgemm permute.

    The permute indices are cached per key order of the incoming batches.
    """

    def __init__(self, wanted: Sequence[str], is_weighted: bool) -> None:
        self._select, self._is_weighted = KeySelection(list(wanted)), is_weighted

    def __call__(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        if self._is_weighted and features.weights_or_none() is None:
            raise ValueError("the embeddings are weighted (is_weighted=True) but the batch has no weights")
        return self._select(features)


def id_check(features: Sequence[str], tables: Sequence[str], rows: Sequence[int], rank: int) -> IdCheck:
    """The check of a batch on the rank that reads it, before any id leaves it.

    A bad layout or id would otherwise be bucketised, sent and looked up on
    another rank; the messages name this rank.
    """
    names = dict(zip(features, zip(tables, rows)))
    return IdCheck(list(names), [t for t, _ in names.values()], [r for _, r in names.values()], rank)


class IdsAllToAll:
    """Moves routed bags to their ranks (see the module docstring).

    `slots_per_rank[d]` is the number of slots rank d looks up; `local_keys`
    are this rank's slot names, in slot order.
    """

    def __init__(
        self,
        slots_per_rank: Sequence[int],
        local_keys: Sequence[str],
        process_group: dist.ProcessGroup,
        weighted: bool,
    ) -> None:
        self._slots_per_rank = list(slots_per_rank)
        self._local_keys = list(local_keys)
        self._group = process_group
        self._weighted = weighted
        self._world_size = len(self._slots_per_rank)
        self._transpose_on: dict[torch.device, torch.Tensor] = {}
        # the padded exchange's piece to the peer, in ids: the largest seen (module docstring)
        self._pad = max(self._slots_per_rank) + 2

    def start(self, routed: KeyedJaggedTensor) -> Awaitable[KeyedJaggedTensor]:
        if self._world_size == 2 and not self._weighted:
            return self._start_padded(routed)
        return self.start_counted(routed)[0]

    def _start_padded(self, routed: KeyedJaggedTensor) -> Awaitable[KeyedJaggedTensor]:
        """`start` in one exchange of the counts beside the data, at two ranks (module docstring)."""
        batch, length_per_key = routed.stride(), routed.length_per_key()
        with_lengths = not uniform_lengths(routed)
        values = routed.values()
        header = values.new_tensor(count_message(batch, length_per_key, self._slots_per_rank, with_lengths))
        data = pack_ids(routed, self._slots_per_rank) if with_lengths else values
        _, data_sent = send_splits(batch, length_per_key, self._slots_per_rank, with_lengths)
        headers = header.split([slots + 2 for slots in self._slots_per_rank])
        datas = data.split(data_sent)
        rank = dist.get_rank(self._group)  # at the call: the group may be made after this object
        peer, pad = 1 - rank, self._pad
        sizes = [h.numel() + d.numel() for h, d in zip(headers, datas, strict=True)]
        sent = [pad, pad]
        sent[rank] = sizes[rank]
        # Each piece written in place, the peer's cut or padded to `pad` (a header always fits in it).
        message = values.new_empty(sum(sent))
        for piece, head, ids in zip(message.split(sent), headers, datas, strict=True):
            piece[: head.numel()] = head
            rest = piece[head.numel() :]
            rest[: ids.numel()] = ids[: rest.numel()]
            rest[ids.numel() :].zero_()
        received = sent  # the peer's piece is padded alike, this rank's own is its own
        buffer = values.new_empty(sum(received))
        handle = shm_exchange.all_to_all_single(buffer, message, received, sent, group=self._group, async_op=True)
        local = len(self._local_keys)

        def finish() -> KeyedJaggedTensor:
            with record_function("## ids_dist.wait ##"):  # exposed when not run ahead
                handle.wait()
            pieces = list(buffer.split(received))
            counts = [piece[: local + 2].tolist() for piece in pieces]
            batch_sizes, lengths_from, received_ids = read_counts([c for row in counts for c in row], local)
            if any(b != batch for b in batch_sizes):
                raise ValueError(
                    f"the ranks feed local batches of sizes {batch_sizes}: sharded embeddings need "
                    "the same batch size on every rank"
                )
            true = [
                local + 2 + local * batch * sent_lengths + sum(row)
                for sent_lengths, row in zip(lengths_from, received_ids, strict=True)
            ]
            largest = max(sizes[peer], true[peer])  # the two pieces between the ranks, known to both
            if largest > pad:  # both ranks know it: the redo's sizes agree
                self._pad = largest
                again = values.new_empty(sum(true))
                whole = torch.cat([part for pair in zip(headers, datas, strict=True) for part in pair])
                shm_exchange.all_to_all_single(again, whole, true, sizes, group=self._group)
                pieces = list(again.split(true))
            transpose = self._transpose_tensor(buffer.device)
            pieces = [piece[local + 2 : n] for piece, n in zip(pieces, true, strict=True)]
            return unpack_ids(pieces, None, batch, received_ids, self._local_keys, transpose, lengths_from)

        return Awaitable(finish)

    def start_counted(self, routed: KeyedJaggedTensor) -> tuple[Awaitable[KeyedJaggedTensor], list[list[int]]]:
        """`start`, and the ids of each local slot from each source rank ([source][slot]).

        The sequence output_dist sends rows back with these counts as its splits.
        """
        batch, length_per_key = routed.stride(), routed.length_per_key()
        with_lengths = not uniform_lengths(routed)
        message = count_message(batch, length_per_key, self._slots_per_rank, with_lengths)
        counts = read_counts(self._exchange_counts(message, routed), len(self._local_keys))
        batch_sizes, lengths_from, received_ids = counts
        if any(b != batch for b in batch_sizes):
            raise ValueError(
                f"the ranks feed local batches of sizes {batch_sizes}: sharded embeddings need "
                "the same batch size on every rank"
            )
        ids_sent, data_sent = send_splits(batch, length_per_key, self._slots_per_rank, with_lengths)
        ids_received = [sum(row) for row in received_ids]
        data_received = [
            len(self._local_keys) * batch * sent + n for sent, n in zip(lengths_from, ids_received, strict=True)
        ]
        values = routed.values()
        data = values.new_empty(sum(data_received))
        handles = [
            shm_exchange.all_to_all_single(
                data,
                pack_ids(routed, self._slots_per_rank) if with_lengths else values.contiguous(),
                data_received,
                data_sent,
                group=self._group,
                async_op=True,
            )
        ]
        weights = None
        if self._weighted:
            sent = routed.weights()
            weights = sent.new_empty(sum(ids_received))
            handles.append(
                shm_exchange.all_to_all_single(weights, sent, ids_received, ids_sent, group=self._group, async_op=True)
            )

        def finish() -> KeyedJaggedTensor:
            with record_function("## ids_dist.wait ##"):  # exposed when not run ahead
                for handle in handles:
                    handle.wait()
            transpose = self._transpose_tensor(data.device)
            pieces = data.split(data_received)
            return unpack_ids(pieces, weights, batch, received_ids, self._local_keys, transpose, lengths_from)

        return Awaitable(finish), received_ids

    def _exchange_counts(self, message: list[int], routed: KeyedJaggedTensor) -> list[int]:
        sent = torch.tensor(message, dtype=torch.int64, device=routed.device())
        received = sent.new_empty(self._world_size * (len(self._local_keys) + 2))
        with record_function("## ids_dist.counts ##"):  # the one host sync of input_dist
            shm_exchange.all_to_all_single(
                received,
                sent,
                [len(self._local_keys) + 2] * self._world_size,
                [slots + 2 for slots in self._slots_per_rank],
                group=self._group,
            )
            return received.tolist()

    def _transpose_tensor(self, device: torch.device) -> torch.Tensor:
        if device not in self._transpose_on:
            local = len(self._local_keys)
            self._transpose_on[device] = transpose_index(self._world_size, local, device)
        return self._transpose_on[device]


def transpose_index(world_size: int, local_slots: int, device: torch.device) -> torch.Tensor:
    """The permute of rows [source][slot] into [slot][source]."""
    order = [s * local_slots + j for j in range(local_slots) for s in range(world_size)]
    return torch.tensor(order, dtype=torch.int32, device=device)


def pack_ids(routed: KeyedJaggedTensor, slots_per_rank: Sequence[int]) -> torch.Tensor:
    """Lengths then ids for each destination, one buffer in the ids' dtype."""
    values, batch = routed.values(), routed.stride()
    lengths = routed.lengths().to(values.dtype)
    ids_sent, _ = send_splits(batch, routed.length_per_key(), slots_per_rank, with_lengths=True)
    pieces, slot, first = [], 0, 0
    for slots, n in zip(slots_per_rank, ids_sent):
        pieces.append(lengths[slot * batch : (slot + slots) * batch])
        pieces.append(values[first : first + n])
        slot, first = slot + slots, first + n
    return torch.cat(pieces)


def _bag_lengths(ids_per_slot: list[int], batch: int, like: torch.Tensor) -> torch.Tensor:
    """The lengths of `batch` bags per slot, each slot's ids shared equally (a source without lengths)."""
    per_bag = torch.tensor([n // batch for n in ids_per_slot], dtype=like.dtype, device=like.device)
    return per_bag.repeat_interleave(batch)


def unpack_ids(
    pieces: Sequence[torch.Tensor],
    weights: torch.Tensor | None,
    batch: int,
    received_ids: list[list[int]],
    local_keys: list[str],
    transpose: torch.Tensor,
    lengths_from: Sequence[bool],
) -> KeyedJaggedTensor:
    """What each source sent (lengths then ids, or only ids) as one batch over all sources.

    `pieces[s]`: source s's part of the received buffer; `received_ids[s][j]`:
    ids of local slot j from source s; `lengths_from[s]`: whether source s sent
    its lengths, else its bags of slot j each hold received_ids[s][j] / batch
    ids. `weights` came in the same [source][slot] order as the ids. Where no
    source sent lengths, each slot's ids are taken from each source where they
    lie, in [slot][source] order, in one copy (a multi-hot rank's 8 MB of ids:
    not a concatenation and then fbgemm's permute, two).
    """
    world_size, local = len(received_ids), len(local_keys)
    if not any(lengths_from):
        return _transposed(pieces, weights, batch, received_ids, local_keys)
    length_pieces, value_pieces = [], []
    for piece, row, sent in zip(pieces, received_ids, lengths_from, strict=True):
        n, width = sum(row), local * batch if sent else 0
        length_pieces.append(piece[:width] if sent else _bag_lengths(row, batch, piece))
        value_pieces.append(piece[width : width + n])
    lengths, values = torch.cat(length_pieces), torch.cat(value_pieces)
    if local > 1 and world_size > 1:
        lengths, values, weights = torch.ops.fbgemm.permute_2D_sparse_data(
            transpose, lengths.view(world_size * local, batch), values, weights, values.numel()
        )
    return KeyedJaggedTensor(
        local_keys,
        values,
        weights,
        lengths=lengths.view(-1),
        stride=world_size * batch,
        length_per_key=[sum(column) for column in zip(*received_ids)],
    )


def _transposed(
    pieces: Sequence[torch.Tensor],
    weights: torch.Tensor | None,
    batch: int,
    received_ids: list[list[int]],
    local_keys: list[str],
) -> KeyedJaggedTensor:
    """`unpack_ids` where every source sent ids only: slot j's ids from source s are the j-th run of
    pieces[s] (weights alike, each source's after the other's)."""
    world_size, local = len(received_ids), len(local_keys)
    ids = [piece.split(row) for piece, row in zip(pieces, received_ids, strict=True)]
    order = [(s, j) for j in range(local) for s in range(world_size)]
    values = torch.cat([ids[s][j] for s, j in order]) if order else pieces[0].new_empty(0)
    if weights is not None and order:
        by_source = weights.split([sum(row) for row in received_ids])
        runs = [part.split(row) for part, row in zip(by_source, received_ids, strict=True)]
        weights = torch.cat([runs[s][j] for s, j in order])
    per_bag = torch.tensor([received_ids[s][j] // batch for s, j in order], dtype=values.dtype)
    return KeyedJaggedTensor(
        local_keys,
        values,
        weights,
        lengths=per_bag.to(values.device).repeat_interleave(batch),
        stride=world_size * batch,
        length_per_key=[sum(column) for column in zip(*received_ids, strict=True)],
    )
