"""The two-tower retrieval loss: a softmax over each query's positive and sampled negatives.

For query i with positive item p_i, the candidates are

    in_batch   the positives of the whole global batch (gathered from every
               rank with gradient, see gather.py); a candidate whose id
               equals p_i, other than p_i's own column, is masked out
    uniform    S ids drawn uniformly from the item table for the step, shared
               by every query and every rank (see sampling.py); an id equal
               to p_i is masked out. With `per_query`, S ids drawn for each
               query instead (generative-recommenders' "local" sampling),
               the same whichever rank the query lands on
    both       the two together (mixed negative sampling)

and the loss is -log softmax(logits)[own positive], with

    logit(i, c) = <q_i, e_c> / temperature - log Q(c)    (log Q only with `logq`)

after an optional L2 normalisation of q and every e. log Q is the log of the
candidate's expected count in the sample it came from (Yi et al. 2019):
in-batch candidates, the query's own positive included, take the item's
batch frequency (streaming estimate or counts, see frequency.py); uniform
samples take log(S / items). With uniform negatives alone the positive is
corrected like a uniform sample, as TensorFlow's sampled softmax does; the
constant then cancels.

The loss is the mean (or sum) over this rank's queries. Over N ranks the
mean of the ranks' losses is one process's loss on the global batch, and the
gradients, averaged over ranks as data parallelism does, are its gradients.

    >>> loss_fn = SampledSoftmaxLoss(SampledSoftmaxConfig(Negatives(in_batch=True), temperature=0.05))
    >>> loss = loss_fn(query, positive, positive_ids)  # query, positive: [B, D]; ids: [B]
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.config.retrieval import SampledSoftmaxConfig
from runtime.retrieval.blocked_softmax import blocked_softmax_loss
from runtime.retrieval.frequency import StreamingFrequency, counts_log_q
from runtime.retrieval.gather import PaddedCounts, gather_ids, gather_rows_and_ids
from runtime.retrieval.sampling import per_query_negatives, uniform_log_q, uniform_negatives

__all__ = ["SampledSoftmaxLoss", "sampled_softmax"]

REDUCTIONS = ("mean", "sum", "none")
CROSSED_CELLS = 1 << 16  # in-batch accidental hits: the largest cross of rows and columns built (_repeated_hits)


def sampled_softmax(
    query: torch.Tensor,
    positive: torch.Tensor,
    positive_ids: torch.Tensor,
    *,
    in_batch: bool = True,
    negatives: torch.Tensor | None = None,
    negative_ids: torch.Tensor | None = None,
    in_batch_log_q: torch.Tensor | None = None,
    negative_log_q: float | None = None,
    temperature: float = 1.0,
    normalize: bool = False,
    process_group: dist.ProcessGroup | None = None,
    reduction: str = "mean",
    row_counts: list[int] | PaddedCounts | None = None,
) -> torch.Tensor:
    """The loss of this rank's queries; the module below fills the arguments from its config.

    `query`, `positive`: [b, D]; `positive_ids`: [b]. `negatives` [S, D] with
    `negative_ids` [S]: the step's uniform samples, the same on every rank;
    or [b, S, D] with [b, S]: each query's own samples.
    `in_batch_log_q`: [B] over the GLOBAL batch's positives in rank order (or
    None: no in-batch correction); `negative_log_q`: the uniform samples'
    correction (None: none). Without in-batch candidates the positive takes
    `negative_log_q`. `row_counts`: every rank's number of queries
    (runtime.retrieval.gather.row_counts), when the caller has exchanged them already, or
    `PaddedCounts` for the candidates' gather to learn them (in-batch candidates only).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"sampled softmax: reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    if not in_batch and negatives is None:
        raise ValueError("sampled softmax: no negatives (in_batch is off and no uniform negatives were given)")
    if normalize:
        query, positive = F.normalize(query, dim=-1), F.normalize(positive, dim=-1)
        negatives = None if negatives is None else F.normalize(negatives, dim=-1)
    rows = torch.arange(query.shape[0], device=query.device)
    blocks, ids, corrections = [], [], []
    if in_batch and negatives is None and in_batch_log_q is None and reduction != "none":
        # in-batch only (next-item training): the [b, B] logits never exist whole (blocked_softmax.py)
        candidates, candidate_ids, offset = gather_rows_and_ids(positive, positive_ids, process_group, row_counts)
        own = rows + offset
        hits = _accidental_hits([candidate_ids], [candidates.T], positive_ids, own, True)
        bound = 1.0 / temperature if normalize else None  # |cosine| <= 1
        return blocked_softmax_loss(query, candidates, own, hits, temperature, reduction, bound=bound)
    if in_batch:
        candidates, candidate_ids, offset = gather_rows_and_ids(positive, positive_ids, process_group, row_counts)
        blocks.append(query @ candidates.T)
        ids.append(candidate_ids)
        corrections.append(in_batch_log_q)
        own = rows + offset
    else:
        blocks.append((query * positive).sum(dim=-1, keepdim=True))
        ids.append(None)
        corrections.append(None if negative_log_q is None else torch.full((1,), negative_log_q, dtype=torch.float64))
        own = torch.zeros_like(rows)
    if negatives is not None and negatives.dim() == 3:
        assert negative_ids is not None
        scores = torch.einsum("bd,bsd->bs", query, negatives)
        own_id = negative_ids.to(positive_ids.device) == positive_ids.unsqueeze(1)
        blocks.append(scores.masked_fill(own_id, float("-inf")))
        ids.append(None)  # its accidental hits are masked here
        corrections.append(
            None if negative_log_q is None else torch.full((negatives.shape[1],), negative_log_q, dtype=torch.float64)
        )
    elif negatives is not None:
        blocks.append(query @ negatives.T)
        ids.append(negative_ids)
        corrections.append(
            None if negative_log_q is None else torch.full((negatives.shape[0],), negative_log_q, dtype=torch.float64)
        )
    logits = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)
    if temperature != 1.0:
        logits = logits / temperature
    if any(correction is not None for correction in corrections):
        logits = logits - _columns(corrections, blocks, logits)
    hits = _accidental_hits(ids, blocks, positive_ids, own, in_batch)
    if hits is not None:
        logits = logits.index_put(hits, torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))
    return F.cross_entropy(logits, own, reduction=reduction)


def _columns(corrections: list[torch.Tensor | None], blocks: list[torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    """One row [1, C] of every column's log Q (0 where a block has none)."""
    parts = [
        torch.zeros(block.shape[1], dtype=torch.float64) if c is None else c.to(torch.float64).reshape(-1)
        for c, block in zip(corrections, blocks)
    ]
    return torch.cat(parts).to(device=logits.device, dtype=logits.dtype).unsqueeze(0)


def _accidental_hits(
    ids: list[torch.Tensor | None],
    blocks: list[torch.Tensor],
    positive_ids: torch.Tensor,
    own: torch.Tensor,
    in_batch: bool,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows, columns) of the logits whose candidate has the query's positive id, the query's own
    column excepted; None when there are none (the usual case: ids rarely repeat in a batch).

    Found by binary search of each positive id in the sorted candidate ids, so no [b, C]
    comparison is built for the few cells that match. With in-batch candidates every positive
    is a candidate already (its own column), so without a repeated candidate id there is no other,
    and with a few there are hits only among the rows and columns that hold one of them.
    """
    device, positive_ids = positive_ids.device, positive_ids.to(torch.long)
    candidate_ids, columns, first = [], [], 0
    for block_ids, block in zip(ids, blocks):
        if block_ids is not None:
            candidate_ids.append(block_ids.to(device=device, dtype=torch.long).reshape(-1))
            columns.append(torch.arange(first, first + block.shape[1], device=device))
        first += block.shape[1]
    if not candidate_ids:
        return None
    everyone = torch.cat(candidate_ids)
    ordered, order = torch.sort(everyone)
    if in_batch:
        repeats = ordered[1:] == ordered[:-1]
        if not bool(repeats.any()):
            return None
        crossed = _repeated_hits(positive_ids, everyone, torch.cat(columns), own, ordered[1:][repeats])
        if crossed is not None:
            return crossed if crossed[0].numel() else None
    left = torch.searchsorted(ordered, positive_ids)
    counts = torch.searchsorted(ordered, positive_ids, right=True) - left
    total = int(counts.sum())
    if total == 0:
        return None
    rows = torch.repeat_interleave(torch.arange(positive_ids.shape[0], device=device), counts, output_size=total)
    starts = torch.repeat_interleave(left - (counts.cumsum(0) - counts), counts, output_size=total)
    cells = torch.cat(columns)[order[starts + torch.arange(total, device=device)]]
    other = cells != own[rows]
    if not bool(other.any()):
        return None
    return rows[other], cells[other]


def _repeated_hits(
    positive_ids: torch.Tensor,
    candidate_ids: torch.Tensor,
    columns: torch.Tensor,
    own: torch.Tensor,
    repeated: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`_accidental_hits` with in-batch candidates whose ids repeat (`repeated`, the repeats' ids): the rows
    and the columns holding one of them, crossed, rows ascending; None where that cross would exceed
    CROSSED_CELLS (ids from a few values), for the binary search. A retrieval-bench batch (1,024 ids
    of 1,048,576) repeats one in 9 steps of 20: 190 us of CPU a call against 370 for the search (Zen 4,
    one thread, a loaded machine; 60 us without a repeat)."""
    rows = torch.isin(positive_ids, repeated).nonzero().squeeze(1)
    cells = torch.isin(candidate_ids, repeated).nonzero().squeeze(1)
    if rows.numel() * cells.numel() > CROSSED_CELLS:
        return None
    pairs = (positive_ids[rows].unsqueeze(1) == candidate_ids[cells].unsqueeze(0)).nonzero()
    hit_rows, hit_columns = rows[pairs[:, 0]], columns[cells[pairs[:, 1]]]
    other = hit_columns != own[hit_rows]
    return hit_rows[other], hit_columns[other]


class SampledSoftmaxLoss(nn.Module):
    """`SampledSoftmaxConfig` as a module: it draws the uniform ids and keeps the frequency state.

    A training step: `ids = loss.negative_ids()` (None without uniform
    negatives), the caller looks their embeddings up, then
    `loss(query, positive, positive_ids, negatives)`. Each training forward
    moves to the next step (the step is a buffer, so a resumed run draws the
    interrupted one's ids); evaluation does not.
    """

    def __init__(
        self,
        config: SampledSoftmaxConfig,
        item_counts: torch.Tensor | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.process_group = process_group
        counting = config.logq and config.negatives.in_batch and config.frequency == "counts"
        if counting != (item_counts is not None):
            raise ValueError(
                "sampled softmax: item_counts are needed exactly when logq is on with in-batch "
                "negatives and frequency 'counts'"
            )
        if item_counts is not None and config.num_items and item_counts.numel() < config.num_items:
            raise ValueError(
                f"sampled softmax: item_counts has {item_counts.numel()} entries for {config.num_items} items"
            )
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self.register_buffer("item_counts", item_counts, persistent=False)
        uses_stream = config.logq and config.negatives.in_batch and config.frequency == "streaming"
        self.frequency = StreamingFrequency(config.frequency_slots, config.frequency_alpha) if uses_stream else None

    def negative_ids(
        self, device: torch.device | str | None = None, queries: slice | None = None, total_queries: int = 0
    ) -> torch.Tensor | None:
        """The current step's uniform negative ids [S], or None without uniform negatives.

        `per_query`: [len(queries), S], the rows of global queries `queries` (of `total_queries`).
        """
        c, uniform = self.config, self.config.negatives.uniform
        if not uniform:
            return None
        if c.negatives.per_query:
            if queries is None:
                raise ValueError("sampled softmax: per_query negatives need the queries' global rows")
            return per_query_negatives(
                c.seed, int(self.step), queries, total_queries, uniform, c.num_items, c.first_id, device
            )
        return uniform_negatives(c.seed, int(self.step), uniform, c.num_items, c.first_id, device)

    def forward(
        self,
        query: torch.Tensor,
        positive: torch.Tensor,
        positive_ids: torch.Tensor,
        negatives: torch.Tensor | None = None,
        reduction: str = "mean",
        row_counts: list[int] | PaddedCounts | None = None,
    ) -> torch.Tensor:
        """The loss of this rank's queries; `negatives` are the embeddings of `negative_ids()`;
        `row_counts` every rank's number of queries, when the caller has exchanged them, or
        `PaddedCounts` for the in-batch candidates' gather to learn them (without logq or per_query)."""
        c, uniform = self.config, self.config.negatives.uniform
        if isinstance(row_counts, PaddedCounts) and not self.learns_counts():
            raise ValueError("sampled softmax: PaddedCounts need in-batch negatives without logq or per_query")
        if uniform and negatives is None:
            raise ValueError("sampled softmax: uniform negatives need the embeddings of negative_ids()")
        if not uniform and negatives is not None:
            raise ValueError("sampled softmax: negatives given but the config draws none (in-batch negatives only)")
        if c.negatives.per_query:
            counts = row_counts if isinstance(row_counts, list) and row_counts else [positive_ids.shape[0]]
            first = sum(counts[: dist.get_rank(self.process_group)]) if len(counts) > 1 else 0
            queries = slice(first, first + positive_ids.shape[0])
            negative_ids = self.negative_ids(positive_ids.device, queries, sum(counts))
            if negatives is not None and tuple(negatives.shape[:2]) != (positive_ids.shape[0], uniform):
                raise ValueError(
                    f"sampled softmax: negative embeddings of shape {tuple(negatives.shape)} for "
                    f"{positive_ids.shape[0]} queries of {uniform} per_query negatives"
                )
        else:
            negative_ids = self.negative_ids(positive_ids.device)
        if not c.negatives.per_query and negatives is not None and negatives.shape[0] != uniform:
            raise ValueError(f"sampled softmax: {negatives.shape[0]} negative embeddings for {uniform} negative ids")
        loss = sampled_softmax(
            query,
            positive,
            positive_ids,
            in_batch=c.negatives.in_batch,
            negatives=negatives,
            negative_ids=negative_ids,
            in_batch_log_q=None
            if isinstance(row_counts, PaddedCounts)
            else self._in_batch_log_q(positive_ids, row_counts),
            negative_log_q=uniform_log_q(uniform, c.num_items, c.first_id) if c.logq and uniform else None,
            temperature=c.temperature,
            normalize=c.normalize,
            process_group=self.process_group,
            reduction=reduction,
            row_counts=row_counts,
        )
        if self.training:
            self.step += 1
        return loss

    def learns_counts(self) -> bool:
        """Whether the in-batch candidates' gather is the first use of the ranks' row counts, so it
        may learn them (`PaddedCounts`): in-batch negatives, without logq or per_query ones."""
        c = self.config
        return c.negatives.in_batch and not c.logq and not c.negatives.per_query

    def _in_batch_log_q(self, positive_ids: torch.Tensor, row_counts: list[int] | None) -> torch.Tensor | None:
        c = self.config
        if not (c.logq and c.negatives.in_batch):
            return None
        global_ids = gather_ids(positive_ids, self.process_group, row_counts)
        if self.frequency is not None:
            if self.training:
                self.frequency.update(global_ids)
            return self.frequency.log_q(global_ids)
        return counts_log_q(self.item_counts, global_ids, global_ids.numel())
