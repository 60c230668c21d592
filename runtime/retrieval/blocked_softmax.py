"""The in-batch softmax loss in row blocks, its gradient taken in the same pass.

With in-batch negatives the logits are an [n, C] matrix (gen-bench: about
12,800 x 12,800, 0.65 GB): built whole, every elementwise step of the loss
(the temperature, the accidental-hit mask, log-softmax, its backward, the
cross-entropy's one-hot gradient) is a pass over memory, and autograd keeps
several such matrices alive. Here the rows go through in blocks small enough
to stay in cache: per block one GEMM for its logits, the mask, log-softmax,
the loss of its rows, then the gradient of the summed loss, softmax minus
one-hot, straight into the two GEMMs that give the block's share of
d/dquery and d/dcandidates. The loss being a sum (or mean), backward only
scales these by its incoming gradient. The function is the plain one,

    loss = sum_i [ logsumexp_j(l_ij) - l_i,own(i) ],   l = (query / T) @ candidates^T,
           l_ij = -inf at the accidental hits,

up to float rounding; tests/runtime/retrieval/test_blocked_softmax.py holds
it to F.cross_entropy on the whole matrix.
"""

from __future__ import annotations

import torch

__all__ = ["BLOCK_ROWS", "blocked_softmax_loss"]

BLOCK_ROWS = 128  # 128 x 12,800 logits = 6.5 MB: in the last-level cache, big enough for GEMM speed


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
        block: int,
    ) -> torch.Tensor:
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        scaled = query * (1.0 / temperature)
        grad_query = torch.empty_like(query) if grads else None
        grad_candidates = torch.zeros_like(candidates) if grads else None
        losses = torch.empty(query.shape[0], dtype=query.dtype, device=query.device)
        starts = None
        if hit_rows is not None:
            starts = torch.searchsorted(hit_rows, torch.arange(0, query.shape[0] + block, block, device=query.device))
        for index, first in enumerate(range(0, query.shape[0], block)):
            last = min(first + block, query.shape[0])
            rows = torch.arange(last - first, device=query.device)
            logits = scaled[first:last] @ candidates.T
            if starts is not None and starts[index + 1] > starts[index]:
                lo, hi = int(starts[index]), int(starts[index + 1])
                logits[hit_rows[lo:hi] - first, hit_columns[lo:hi]] = float("-inf")
            log_p = torch.log_softmax(logits, dim=1)
            columns = own[first:last]
            losses[first:last] = -log_p[rows, columns]
            if grads:
                p = log_p.exp_()
                p[rows, columns] -= 1.0  # d(loss)/d(logits) = softmax - one-hot
                torch.mm(p, candidates, out=grad_query[first:last])
                grad_candidates.addmm_(p.T, scaled[first:last])
        if grads:
            grad_query.mul_(1.0 / temperature)
            ctx.save_for_backward(grad_query, grad_candidates)
        return losses.sum()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):  # type: ignore[override]
        grad_query, grad_candidates = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad_query * grad, grad_candidates * grad, None, None, None, None, None


def blocked_softmax_loss(
    query: torch.Tensor,
    candidates: torch.Tensor,
    own: torch.Tensor,
    hits: tuple[torch.Tensor, torch.Tensor] | None,
    temperature: float,
    reduction: str = "sum",
    block: int = BLOCK_ROWS,
) -> torch.Tensor:
    """sum (or mean) over rows i of -log softmax((query / T) @ candidates^T)[i, own[i]].

    `query` [n, D], `candidates` [C, D], `own` [n] each row's own column; `hits` (rows, columns)
    of the cells masked to -inf, rows ascending (None: none).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"blocked softmax: reduction {reduction!r} is not sum or mean")
    hit_rows, hit_columns = (None, None) if hits is None else hits
    total = _BlockedSoftmax.apply(query, candidates, own, hit_rows, hit_columns, float(temperature), int(block))
    return total / max(1, query.shape[0]) if reduction == "mean" else total
