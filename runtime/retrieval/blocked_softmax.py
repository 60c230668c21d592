"""The in-batch softmax loss in row blocks, its gradient taken in the same pass.

With in-batch negatives the logits are an [n, C] matrix (gen-bench: about
12,800 x 12,800, 0.65 GB): built whole, every elementwise step of the loss
(the temperature, the accidental-hit mask, log-softmax, its backward, the
cross-entropy's one-hot gradient) is a pass over memory, and autograd keeps
several such matrices alive. Here the rows go through in blocks small enough
to stay in cache: per block one GEMM for its logits, the mask, the softmax,
the loss of its rows, then the gradient of the summed loss, softmax minus
one-hot, straight into the two GEMMs that give the block's share of
d/dquery and d/dcandidates. The loss being a sum (or mean), backward only
scales these by its incoming gradient. The function is the plain one,

    loss = sum_i [ logsumexp_j(l_ij) - l_i,own(i) ],   l = (query / T) @ candidates^T,
           l_ij = -inf at the accidental hits,

up to float rounding; tests/runtime/retrieval/test_blocked_softmax.py holds
it to F.cross_entropy on the whole matrix.

Two ways to the softmax. With a bound on the logits known beforehand (1 / T
for L2-normalised sides) at most EXP_SAFE, exp needs no row maxima: exp in
place, the row sums, and the division folded into the [b, D] sides of the
GEMMs, two passes over the block. Otherwise torch's softmax (row maxima, its
own vectorised exp), and a row's loss is -log of its own entry: 0.3 ms on a
512 x 1,024 block where log-softmax then exp took 0.77 (AMD EPYC Zen 4, one
thread). Where that entry is below float's smallest normal (a loss past 87
in float32) it has lost its precision, and those rows take logsumexp minus
their own logit instead.

In fp32 on the CPU, with D a multiple of 16, the same function may run in one native pass
(runtime/cpu/native/in_batch_softmax.c: each thread takes a share of the rows, tile by tile,
the tile's logits, softmax and both gradient products from the cache, d/dcandidates summed
over the threads' copies at the end), where runtime.cpu.choice's `in_batch_softmax` measures it
faster on the run's shapes: torch's path splits each GEMM and the softmax over the threads
separately, and the narrow products (K or N = D) scaled poorly to the second core
(retrieval-bench's 1,024 x 1,024 x 64: the accumulated d/dcandidates 1.46 ms at one thread, 1.16 at two).
It always takes the row maxima, so it needs no bound.

Under bf16 training (runtime.train.precision's autocast) the three products
of a block may run in bf16: inputs rounded to bf16, products accumulated in
fp32 by the GEMM, outputs widened to fp32; the temperature, the mask, exp,
the row sums, the logs and each row's own logit (an fp32 dot product) stay
fp32. Whether they do is measured at first use (runtime.cpu.choice's
`softmax_gemm`, fp32 or bf16, on the run's first block shapes), never
assumed: where bf16 GEMMs are not faster, the fp32 path runs. Held to the
fp32 function on random inputs within BF16_TOLERANCE
(tests/runtime/retrieval/test_blocked_softmax.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from runtime.cpu import choice, native
from runtime.modules.layers.autocast import bf16_autocast
from runtime.modules.layers.linear import onednn_applies

__all__ = ["BF16_TOLERANCE", "BLOCK_LOGITS", "BLOCK_ROWS", "EXP_SAFE", "block_rows", "blocked_softmax_loss"]

# exp(60) * 2**31 candidates < float32's max, exp(-60) > its smallest normal: logits bounded by
# this need no row maxima
EXP_SAFE = 60.0
# A block's logits: 512 x 12,800 = 26 MB, in a 32 MB last-level cache. Against 12,800 candidates
# (gen-bench local) 128 rows took 2.4x the CPU time of 512; against 25,600 (dist2's global batch)
# 512 rows took 1.1-1.3x the time of 256, which keep the same 26 MB.
BLOCK_LOGITS = 512 * 12_800
BLOCK_ROWS = 512  # the most rows a block takes (fewer candidates: no gain from longer blocks)
MIN_BLOCK_ROWS = 64  # the GEMMs' efficiency falls below this
# The bf16 products against the fp32 function: the loss's relative error, and each gradient's
# error norm over its norm (inputs rounded to 8 bits of mantissa, outputs to bf16 before widening)
# measured: loss 2e-5 to 2e-4, gradients 3e-3 to 6e-3 (600 unit rows, T = 0.05, random and trained-like)
BF16_TOLERANCE = {"loss": 1e-3, "gradient": 1e-2}


def block_rows(candidates: int) -> int:
    """Rows per block against `candidates` columns: the block's logits about BLOCK_LOGITS."""
    return max(MIN_BLOCK_ROWS, min(BLOCK_ROWS, BLOCK_LOGITS // max(1, candidates)))


def _times_transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T, on oneDNN where runtime.modules.layers.linear would take it: MKL's generic path on AMD
    ran these two products 2.2x (logits, K = 64) and 1.4x (K = 12,800) slower at one thread."""
    if onednn_applies(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    return x @ weight.T


class _Products:
    """A block's three GEMMs, fp32 or with bf16 inputs (fp32 accumulation, fp32 results).

    In bf16 a block's [rows, C] logits and softmax pass through two buffers made once per call, the
    same memory every block: fresh ones, freed and made again in bf16 and fp32 by turns, were
    returned to the system and faulted in again each time (gen-bench's blocks, 512 x 12,800 on a
    Xeon with AMX: each cast 5.3 ms against 1.1 ms into a buffer, the products 1.3 to 2.9 ms).
    """

    def __init__(self, scaled: torch.Tensor, candidates: torch.Tensor, bf16: bool) -> None:
        self.bf16 = bf16
        self.candidates = candidates.to(torch.bfloat16) if bf16 else candidates
        self.scaled = scaled.to(torch.bfloat16) if bf16 else scaled
        self._buffers: dict[torch.dtype, torch.Tensor] = {}

    def _buffer(self, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """The first `rows` rows of this call's [rows, C] buffer of `dtype` (made at the first block, the largest)."""
        full = self._buffers.get(dtype)
        if full is None or full.shape[0] < rows:
            full = self._buffers[dtype] = self.scaled.new_empty((rows, self.candidates.shape[0]), dtype=dtype)
        return full[:rows]

    def logits(self, first: int, last: int) -> torch.Tensor:
        """(query / T)[first:last] @ candidates^T, fp32 (bf16: in the fp32 buffer, valid until the next block)."""
        if not self.bf16:
            return _times_transposed(self.scaled[first:last], self.candidates)
        rows = last - first
        products = torch.mm(self.scaled[first:last], self.candidates.T, out=self._buffer(rows, torch.bfloat16))
        return self._buffer(rows, torch.float32).copy_(products)

    def narrow(self, p: torch.Tensor) -> torch.Tensor:
        """A block's softmax as the two gradient products take it (bf16: one cast, into the bf16 buffer)."""
        return self._buffer(p.shape[0], torch.bfloat16).copy_(p) if self.bf16 else p

    def times_candidates(self, p: torch.Tensor) -> torch.Tensor:
        """p @ candidates, fp32; `p` from `narrow`."""
        out = _times_transposed(p, self.candidates.T)
        return out.float() if self.bf16 else out

    def add_transposed(self, into: torch.Tensor, rows: torch.Tensor, p: torch.Tensor) -> None:
        """into += rows^T @ p (into [D, C] fp32); `p` from `narrow`."""
        if self.bf16:
            into.add_(rows.T.to(torch.bfloat16) @ p)
        else:
            into.addmm_(rows.T, p)


def _row_losses(logits: torch.Tensor, p: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[i, columns[i]] per row, from the softmax `p` of `logits`."""
    own_p = p.gather(1, columns.unsqueeze(1)).squeeze(1)
    losses = own_p.log().neg_()
    faint = own_p < torch.finfo(p.dtype).tiny  # underflowed or subnormal: too few bits left
    if bool(faint.any()):
        rows = faint.nonzero().squeeze(1)
        picked = logits[rows]
        losses[rows] = torch.logsumexp(picked, dim=1) - picked.gather(1, columns[rows].unsqueeze(1)).squeeze(1)
    return losses


class _BlockedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        query: torch.Tensor,
        candidates: torch.Tensor,
        own: torch.Tensor,
        hit_rows: torch.Tensor | None,
        hit_columns: torch.Tensor | None,
        temperature: float,
        bound: float | None,
        block: int,
        bf16: bool,
        fused: bool,
    ) -> torch.Tensor:
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        if fused:
            scaled = query if temperature == 1.0 else query * (1.0 / temperature)
            hits = None if hit_rows is None or hit_columns is None else (hit_rows, hit_columns)
            losses, grad_query, grad_candidates = native.in_batch_softmax(
                scaled, candidates, own, hits, 1.0 / temperature, grads
            )
            if grad_query is not None and grad_candidates is not None:
                ctx.save_for_backward(grad_query, grad_candidates)
            return losses.sum()
        n = query.shape[0]
        bounded = bound is not None and bound <= EXP_SAFE
        scaled = query if temperature == 1.0 else query * (1.0 / temperature)
        products = _Products(scaled, candidates, bf16)
        grad_query_blocks: list[torch.Tensor] = []
        # d/dcandidates accumulates transposed, [D, C]: (query-side rows)^T @ softmax ran 1.3x faster than
        # softmax^T @ rows into [C, D] (K = D = 64, oneDNN and MKL alike; AMD EPYC Zen 4, one thread)
        grad_candidates_t = candidates.new_zeros(candidates.shape[::-1]) if grads else None
        own_part = torch.zeros_like(candidates) if grads and bounded else None  # the one-hot's share, [C, D]
        losses = torch.empty(n, dtype=query.dtype, device=query.device)
        starts = None
        if hit_rows is not None:
            starts = torch.searchsorted(hit_rows, torch.arange(0, n + block, block, device=query.device)).tolist()
        for index, first in enumerate(range(0, n, block)):
            last = min(first + block, n)
            columns = own[first:last]
            logits = products.logits(first, last)
            if starts is not None and starts[index + 1] > starts[index]:
                lo, hi = starts[index], starts[index + 1]
                logits[hit_rows[lo:hi] - first, hit_columns[lo:hi]] = float("-inf")
            if bounded:
                if bf16:  # fp32 dot products: the loss's own term without bf16's rounding
                    own_logits = (scaled[first:last] * candidates[columns]).sum(dim=1)
                else:
                    own_logits = logits.gather(1, columns.unsqueeze(1)).squeeze(1)
                p = logits.exp_()  # unnormalised: the row sums divide the [b, D] sides below
                sums = p.sum(dim=1)
                losses[first:last] = sums.log() - own_logits
                if grads:
                    assert grad_candidates_t is not None and own_part is not None
                    inverse = sums.reciprocal_().unsqueeze(1)
                    narrow = products.narrow(p)
                    block_grad = products.times_candidates(narrow).mul_(inverse)
                    grad_query_blocks.append(block_grad.sub_(candidates[columns]))
                    products.add_transposed(grad_candidates_t, scaled[first:last] * inverse, narrow)
                    own_part.index_add_(0, columns, scaled[first:last])
                continue
            p = torch.softmax(logits, dim=1)
            losses[first:last] = _row_losses(logits, p, columns)
            if grads:
                assert grad_candidates_t is not None
                # d(loss)/d(logits) = softmax - one-hot, into the two GEMMs
                p.scatter_add_(1, columns.unsqueeze(1), p.new_full((last - first, 1), -1.0))
                narrow = products.narrow(p)
                grad_query_blocks.append(products.times_candidates(narrow))
                products.add_transposed(grad_candidates_t, scaled[first:last], narrow)
        if grad_candidates_t is not None:
            grad_query = grad_query_blocks[0] if len(grad_query_blocks) == 1 else torch.cat(grad_query_blocks)
            if temperature != 1.0:
                grad_query.mul_(1.0 / temperature)
            grad_candidates = grad_candidates_t.T.contiguous()
            if own_part is not None:
                grad_candidates.sub_(own_part)
            ctx.save_for_backward(grad_query, grad_candidates)
        return losses.sum()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):  # type: ignore[override]
        grad_query, grad_candidates = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad_query * grad, grad_candidates * grad, None, None, None, None, None, None, None, None


def blocked_softmax_loss(
    query: torch.Tensor,
    candidates: torch.Tensor,
    own: torch.Tensor,
    hits: tuple[torch.Tensor, torch.Tensor] | None,
    temperature: float,
    reduction: str = "sum",
    block: int | None = None,
    bound: float | None = None,
) -> torch.Tensor:
    """sum (or mean) over rows i of -log softmax((query / T) @ candidates^T)[i, own[i]].

    `query` [n, D], `candidates` [C, D], `own` [n] each row's own column; `hits` (rows, columns)
    of the cells masked to -inf, rows ascending (None: none). `bound`: a bound on |query_i . c_j| / T
    known beforehand (1 / T for L2-normalised sides): at most EXP_SAFE, softmax needs no row maxima.
    `block`: rows per block (None: `block_rows` of the candidates). Under a CPU bf16 autocast
    the block's products take bf16 where `softmax_gemm` measures it faster (module docstring).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"blocked softmax: reduction {reduction!r} is not sum or mean")
    hit_rows, hit_columns = (None, None) if hits is None else hits
    rows = block_rows(candidates.shape[0]) if block is None else int(block)
    bf16 = (
        query.device.type == "cpu"
        and bf16_autocast()
        and _bf16_products(min(rows, query.shape[0]), candidates.shape[0], candidates.shape[1])
    )
    # fp32 under bf16 training (runtime.train.precision) too: logits at 1 / T = 20 need its mantissa
    with contextlib.ExitStack() as fp32:
        if query.device.type in ("cpu", "cuda"):
            fp32.enter_context(torch.autocast(query.device.type, enabled=False))
        dtype = torch.promote_types(torch.promote_types(query.dtype, candidates.dtype), torch.float32)
        total = _BlockedSoftmax.apply(
            query.to(dtype),
            candidates.to(dtype),
            own,
            hit_rows,
            hit_columns,
            float(temperature),
            bound,
            rows,
            bf16,
            not bf16 and _fused(query, candidates, dtype),
        )
    return total / max(1, query.shape[0]) if reduction == "mean" else total


def _fused(query: torch.Tensor, candidates: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the native one-pass kernel runs: fp32 CPU tensors, D a multiple of 16, and measured
    faster here (once per run and site, backward included, on random operands: the call's candidates
    and at most two blocks of its rows, which a per-row cost needs, and gen-bench's 12,800 would not)."""
    n, dim = query.shape
    if dtype != torch.float32 or dim % 16 or n == 0 or not native.applies([query, candidates], None):
        return False
    count = candidates.shape[0]
    timed_rows = min(n, 2 * block_rows(count))

    def runs() -> dict[str, Callable[[], None]]:
        generator = torch.Generator().manual_seed(0)
        q, c = (torch.randn(size, dim, generator=generator).mul_(0.3).requires_grad_() for size in (timed_rows, count))
        own = torch.randint(0, count, (timed_rows,), generator=generator)
        args = (own, None, None, 1.0, None, block_rows(count), False)
        return {
            "torch": lambda: _BlockedSoftmax.apply(q, c, *args, False).backward(),
            "native": lambda: _BlockedSoftmax.apply(q, c, *args, True).backward(),
        }

    shape = f"{choice.bucket(timed_rows)}x{choice.bucket(count)}x{dim}_t{torch.get_num_threads()}"
    return choice.choose("in_batch_softmax", shape, runs, site=f"in_batch_softmax_{dim}") == "native"


def _bf16_products(rows: int, candidates: int, dim: int) -> bool:
    """Whether a block's three products run faster in bf16 here: measured once per run (site) on
    random operands of the block's shapes, casts included; kept in runtime.cpu.choice's records."""

    operands: list[torch.Tensor] = []  # made at the first timing run: a recorded choice never builds them

    def timed(bf16: bool) -> Callable[[], None]:
        def run() -> None:
            if not operands:
                generator = torch.Generator().manual_seed(0)
                operands.extend(torch.randn(n, dim, generator=generator) for n in (rows, candidates))
            query, items = operands
            with torch.autocast("cpu", enabled=False):  # as the loss runs them: the caller's bf16 autocast is on
                products = _Products(query, items, bf16)
                p = products.narrow(products.logits(0, rows))
                products.times_candidates(p)
                products.add_transposed(torch.zeros(dim, candidates), query, p)

        return run

    shape = f"{choice.bucket(rows)}x{choice.bucket(candidates)}x{dim}"
    runs = {"fp32": timed(False), "bf16": timed(True)}
    return choice.choose("softmax_gemm", shape, runs, site=f"blocked_softmax_{dim}") == "bf16"
