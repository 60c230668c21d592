"""Row-wise Adagrad in the backward of a fused lookup, on the C kernel instead of fbgemm's.

fbgemm's CPU backward for a table-batched lookup sorts each table's ids with
a general sort and then updates the rows; at dlrm-bench's multihot shapes it
is most of a training step (≈ 290 ms of CPU for 1M ids on the AVX2 machine
of issue 15, against ≈ 30 ms for the forward). runtime/cpu/native/rowwise_adagrad.c
does the same update on the same state (the TBE's `weights_host` and
`momentum1_host`, in place) after a radix sort over the bits of the row count.

`lookup(tbe, layout(tbe), ...)` runs fbgemm's forward and backward or, where the kernel applies
(`supports`: a CPU TBE with row-wise Adagrad and no weight decay, the native library loaded),
the C forward and update: the forward is runtime/cpu/native/quant_pool.c's pooling of
float32 rows, which gives fbgemm's bits on all of torch's threads (fbgemm's CPU forward pools
on one), and is faster than fbgemm's even on one (`_pool`). Which of the two runs is chosen by
measurement at first use per shape (runtime/cpu/choice.py, kernel 'embedding_update'). The
measurement runs both on a zero gradient, which leaves weights and state unchanged
(m += 0, w -= lr * 0 / (sqrt(m) + eps)), so it needs eps > 0; with eps = 0 fbgemm's path runs unmeasured. It runs on
a detached copy of the per-id weights, so it leaves no gradient on them (nor
runs the backward of whatever computed them): the step that follows sees the
true one, d loss / d w_i = <gradient of i's bag, row of id i>, which the C
path computes from the rows as the forward read them, before it updates them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from runtime.cpu import choice, native

__all__ = ["layout", "lookup", "supports"]


# The C kernel sorts (row << 32 | occurrence) keys: a table of more rows takes fbgemm's backward.
ROW_LIMIT = 2**32


def supports(tbe: Any, optimizer_type: str, weight_decay: float) -> bool:
    """Whether the C update can stand in for this TBE's backward."""
    return (
        optimizer_type == "rowwise_adagrad"
        and weight_decay == 0
        and float(tbe.optimizer_args.eps) > 0
        and tbe.weights_host.numel() > 0
        and int(tbe.rows_per_table.max()) <= ROW_LIMIT
        and native.applies([tbe.weights_host, tbe.momentum1_host])
    )


def layout(tbe: Any) -> native.TableLayout:
    """The kernel's view of the TBE's host layout (fixed once the TBE is built)."""
    # fbgemm keeps weights_offsets, momentum1_offsets and rows_per_table per feature: take each table's first.
    as64 = lambda values: torch.as_tensor(values, dtype=torch.int64).contiguous()  # noqa: E731
    table_of = [int(t) for t in tbe.feature_table_map]
    first = [table_of.index(t) for t in range(max(table_of) + 1)]
    dims = (tbe.D_offsets[1:] - tbe.D_offsets[:-1]).tolist()
    features = range(len(table_of))
    float_bytes = tbe.weights_host.element_size()
    return native.TableLayout(
        weight_offsets=as64([int(tbe.weights_offsets[f]) for f in first]),
        momentum_offsets=as64([int(tbe.momentum1_offsets[f]) for f in first]),
        rows=as64([int(tbe.rows_per_table[f]) for f in first]),
        dims=as64([dims[f] for f in first]),
        feature_tables=as64(table_of),
        grad_columns=as64(tbe.D_offsets[:-1]),
        pool=native.QuantLayout(
            table_offsets=as64([int(tbe.weights_offsets[f]) * float_bytes for f in features]),
            strides=as64([dims[f] * float_bytes for f in features]),
            types=as64([native.QUANT_FP32] * len(table_of)),
            dims=as64(dims),
            out_offsets=as64(tbe.D_offsets[:-1]),
            total_dim=int(tbe.D_offsets[-1]),
        ),
        feature_rows=as64([int(tbe.rows_per_table[f]) for f in features]),
    )


def _pool(
    table_layout: native.TableLayout,
    rows: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """The bags' sums, by runtime/cpu/native/quant_pool.c: fbgemm's bits, on as many of torch's
    threads as the ids pay for (fbgemm's CPU forward pools on one).

    Even on one thread it is the faster: it prefetches the rows some ids ahead into L2
    (dlrm-bench multihot dist2, a rank's 13 tables of 100,000 rows, 1.06M ids, 1 thread on
    the 2-core Zen 4: 20-23 ms against fbgemm's 27-33; criteo's 53k ids: 3.0-3.4 against 3.8-4.3)."""
    pooled = native.quant_pool(rows, table_layout.pool, values, offsets, weights, table_layout.feature_rows)
    if pooled is None:
        raise ValueError("embedding lookup: an id is outside its table's rows (the batch was not checked)")
    return pooled


class _NativeUpdate(torch.autograd.Function):
    """Forward: `_pool`, fbgemm's sums; backward: the C row-wise Adagrad update of the TBE's state in place."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        tbe: Any,
        table_layout: native.TableLayout,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        parameter: torch.Tensor,
    ) -> torch.Tensor:
        pooled = _pool(table_layout, tbe.weights_host.detach(), values, offsets, weights)
        ctx.tbe, ctx.layout, ctx.inputs = tbe, table_layout, (values, offsets, weights)
        return pooled

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        tbe, (values, offsets, weights) = ctx.tbe, ctx.inputs
        # The weights' gradient reads the rows as the forward did: before the update below moves them.
        weights_grad = _weights_grad(tbe, ctx.layout, values, offsets, grad) if ctx.needs_input_grad[4] else None
        status = native.rowwise_adagrad_backward(
            tbe.weights_host.detach(),
            tbe.momentum1_host.detach(),
            ctx.layout,
            values,
            offsets,
            weights,
            grad,
            float(tbe.learning_rate_tensor),
            float(tbe.optimizer_args.eps),
        )
        if status & 1:
            raise ValueError("embedding update: an id is outside its table's rows (the batch was not checked)")
        if status:
            raise MemoryError("embedding update: the native kernel could not allocate its scratch space")
        return None, None, None, None, weights_grad, None


def _weights_grad(
    tbe: Any,
    table_layout: native.TableLayout,
    values: torch.Tensor,
    offsets: torch.Tensor,
    grad: torch.Tensor,
) -> torch.Tensor:
    """d loss / d w_i = <grad of id i's bag in its feature's columns, id i's row>, for every id i."""
    features = table_layout.feature_tables.numel()
    batch = (offsets.numel() - 1) // max(features, 1)
    lengths = offsets[1:] - offsets[:-1]
    bags = torch.repeat_interleave(torch.arange(features * batch), lengths, output_size=values.numel())
    out = torch.empty(values.numel(), dtype=grad.dtype)
    rows_host = tbe.weights_host.detach()
    for f in range(features):
        start, end = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
        if start == end:
            continue
        table = int(table_layout.feature_tables[f])
        dim, column = int(table_layout.dims[table]), int(table_layout.grad_columns[f])
        first = int(table_layout.weight_offsets[table])
        rows = rows_host[first : first + int(table_layout.rows[table]) * dim].view(-1, dim)
        bag_grad = grad[bags[start:end] - f * batch, column : column + dim]
        out[start:end] = (rows.index_select(0, values[start:end]) * bag_grad).sum(1)
    return out


def _choose(
    tbe: Any,
    table_layout: native.TableLayout,
    values: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
) -> str:
    features = len(tbe.feature_table_map)
    batch = (offsets.numel() - 1) // max(features, 1)
    shape = (
        f"b{choice.bucket(batch)}_ids{choice.bucket(values.numel())}_tables{table_layout.rows.numel()}"
        f"_rows{int(table_layout.rows.sum())}_width{int(tbe.D_offsets[-1])}"
        f"_{'weighted' if weights is not None else 'plain'}_t{torch.get_num_threads()}"
    )

    # Timed on a copy: a zero gradient must not reach the caller's weights (nor the graph behind them).
    timed_weights = None if weights is None else weights.detach()

    def timed(native_backward: bool) -> Callable[[], None]:
        def step() -> None:
            if native_backward:
                pooled = _NativeUpdate.apply(tbe, table_layout, values, offsets, timed_weights, tbe.weights_host)
            else:
                pooled = tbe(values, offsets, timed_weights)
            pooled.backward(torch.zeros_like(pooled))  # a zero gradient leaves weights and state as they are

        return step

    site = shape[shape.index("_tables") + 1 : shape.rindex("_t")]  # the table group: not the batch's id count
    return choice.choose("embedding_update", shape, {"fbgemm": timed(False), "native": timed(True)}, site=site)


def lookup(
    tbe: Any,
    table_layout: native.TableLayout | None,
    values: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """The TBE's pooled lookup; in training, given the layout of a TBE the kernel `supports`,
    backed by the C update where it measured faster at these shapes."""
    if table_layout is None or not torch.is_grad_enabled():
        return tbe(values, offsets, weights)
    if _choose(tbe, table_layout, values, offsets, weights) == "native":
        return _NativeUpdate.apply(tbe, table_layout, values, offsets, weights, tbe.weights_host)
    return tbe(values, offsets, weights)
