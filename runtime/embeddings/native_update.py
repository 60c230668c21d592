"""Row-wise Adagrad in the backward of a fused lookup, on the C kernel instead of fbgemm's.

fbgemm's CPU backward for a table-batched lookup sorts each table's ids with
a general sort and then updates the rows; at dlrm-bench's multihot shapes it
is most of a training step (≈ 290 ms of CPU for 1M ids on the AVX2 machine
of issue 15, against ≈ 30 ms for the forward). runtime/cpu/native/rowwise_adagrad.c
does the same update on the same state (the TBE's `weights_host` and
`momentum1_host`, in place) after a radix sort over the bits of the row count.

`lookup(tbe, layout(tbe), ...)` runs fbgemm's forward and, where the kernel applies (`supports`:
a CPU TBE with row-wise Adagrad and no weight decay, the native library loaded),
backs it with the C update; which of the two backwards runs is chosen by
measurement at first use per shape (runtime/cpu/choice.py, kernel
'embedding_update'). The measurement runs both on a zero gradient, which
leaves weights and state unchanged (m += 0, w -= lr * 0 / (sqrt(m) + eps)),
so it needs eps > 0; with eps = 0 fbgemm's path runs unmeasured.
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
    return native.TableLayout(
        weight_offsets=as64([int(tbe.weights_offsets[f]) for f in first]),
        momentum_offsets=as64([int(tbe.momentum1_offsets[f]) for f in first]),
        rows=as64([int(tbe.rows_per_table[f]) for f in first]), dims=as64([dims[f] for f in first]),
        feature_tables=as64(table_of), grad_columns=as64(tbe.D_offsets[:-1]),
    )


class _NativeUpdate(torch.autograd.Function):
    """fbgemm's forward; backward: the C row-wise Adagrad update of the TBE's state in place."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, tbe: Any, table_layout: native.TableLayout, values: torch.Tensor, offsets: torch.Tensor,
        weights: torch.Tensor | None, parameter: torch.Tensor,
    ) -> torch.Tensor:
        with torch.no_grad():
            pooled = tbe(values, offsets, weights)
        ctx.tbe, ctx.layout, ctx.inputs = tbe, table_layout, (values, offsets, weights)
        return pooled

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
        tbe, (values, offsets, weights) = ctx.tbe, ctx.inputs
        status = native.rowwise_adagrad_backward(
            tbe.weights_host.detach(), tbe.momentum1_host.detach(), ctx.layout, values, offsets, weights, grad,
            float(tbe.learning_rate_tensor), float(tbe.optimizer_args.eps),
        )
        if status & 1:
            raise ValueError("embedding update: an id is outside its table's rows (the batch was not checked)")
        if status:
            raise MemoryError("embedding update: the native kernel could not allocate its scratch space")
        return None, None, None, None, None, None


def _choose(
    tbe: Any, table_layout: native.TableLayout, values: torch.Tensor, offsets: torch.Tensor,
    weights: torch.Tensor | None,
) -> str:
    features = len(tbe.feature_table_map)
    batch = (offsets.numel() - 1) // max(features, 1)
    shape = (
        f"b{choice.bucket(batch)}_ids{choice.bucket(values.numel())}_tables{table_layout.rows.numel()}"
        f"_rows{int(table_layout.rows.sum())}_width{int(tbe.D_offsets[-1])}"
        f"_{'weighted' if weights is not None else 'plain'}_t{torch.get_num_threads()}"
    )

    def timed(native_backward: bool) -> Callable[[], None]:
        def step() -> None:
            if native_backward:
                pooled = _NativeUpdate.apply(tbe, table_layout, values, offsets, weights, tbe.weights_host)
            else:
                pooled = tbe(values, offsets, weights)
            pooled.backward(torch.zeros_like(pooled))  # a zero gradient leaves weights and state as they are
        return step

    site = shape[shape.index("_tables") + 1 : shape.rindex("_t")]  # the table group: not the batch's id count
    return choice.choose("embedding_update", shape, {"fbgemm": timed(False), "native": timed(True)}, site=site)


def lookup(
    tbe: Any, table_layout: native.TableLayout | None, values: torch.Tensor, offsets: torch.Tensor,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """The TBE's pooled lookup; in training, given the layout of a TBE the kernel `supports`,
    backed by the C update where it measured faster at these shapes."""
    if table_layout is None or not torch.is_grad_enabled():
        return tbe(values, offsets, weights)
    if _choose(tbe, table_layout, values, offsets, weights) == "native":
        return _NativeUpdate.apply(tbe, table_layout, values, offsets, weights, tbe.weights_host)
    return tbe(values, offsets, weights)
