"""QuantEmbeddingBagCollection: pooled lookups of inference tables at fp32, fp16, int8 or int4.

The serving counterpart of `runtime.embeddings.bag_collection.EmbeddingBagCollection`, the
`embeddings` module of an exported inference model (`reccompile export`):
ids in a KeyedJaggedTensor in, pooled embeddings in a KeyedTensor out, same
output order (table order, then each table's features), forward only.

All tables live in one fbgemm `IntNBitTableBatchedEmbeddingBagsCodegen`
layout, each at its own precision; one call of fbgemm's
`int_nbit_split_embedding_codegen_lookup_function` pools every feature, or on
the CPU (float32 output, outside tracing) runtime/cpu/native's quant_pool.c, which
reads the same layout, gives the same bits, and splits the bags over torch's
threads (one per 1,024 ids at most: runtime/cpu/native's IDS_PER_THREAD)
where fbgemm's kernel uses one (1.2-3.4x faster at batch 512 with 20
ids per feature; 1.7-2.2x on the 2-core AVX2 EPYC), where it is the faster at the batch's shapes
(runtime/cpu/choice.py, kernel 'quant_pool'). The TBE class is built only to lay the tables out (its
offsets, row sizes and type codes); the collection owns the weight bytes as a
buffer and calls the kernel itself, because the TBE module holds TorchScript objects that
`torch.export` cannot trace and adds per-call work a server does not need.
`to_fbgemm()` gives back the equivalent fbgemm module. On the CPU the
weight buffer sits on transparent huge pages (runtime/cpu/huge_pages.py):
rows are read at random over the whole buffer.

Row layout (fbgemm's, host rows unpadded): fp32 and fp16 rows are the
values; an int8 or int4 row is a float16 scale and a float16 bias, then the
codes (int4: two per byte, low nibble first), and reads as
`code * scale + bias`. Quantisation is fbgemm's
`FloatToFusedNBitRowwiseQuantizedSBHalf`: per row, bias = min and
scale = (max - min) / (2**bits - 1) rounded to float16, codes rounded to
nearest. Error per value, measured against the fp32 row:

    fp32  0
    fp16  <= |x| * 2**-11 (values beyond float16's range are refused)
    int8  <= scale / 2, scale = the row's range / 255
    int4  <= scale / 2, scale = the row's range / 15

so a pooled bag is off by at most the sum of those over its ids (times the
per-id weights). tests/runtime/serving/test_quant_embedding.py asserts these bounds;
runtime/serving/quant_sequence.py reads the same layout as sequences.

Tables whose dim is not a multiple of 4 (fbgemm's kernels store rows of
4-byte units: hstu.yaml's and sasrec.yaml's 50) are stored padded to the
next multiple (`stored_dim`): each row ends in copies of its last value,
so an int8/int4 row keeps its minimum, maximum and codes, and the kernel's
output keeps only the table's own columns. The stored rows (state dict,
`table_rows`, an export's files) are the padded ones; everything else
(`dequantized_weights`, the output, `quantize_from`) is at the table's dim.

Pooling: `sum`, or `mean` computed as training computes it (sum pooling
with per-id weights w_i / L), so fp32 tables give bit-identical results to
the training collection. State dict: `<table>.packed`, the table's rows in
the layout above (uint8, rows x row bytes).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
    IntNBitTableBatchedEmbeddingBagsCodegen,
    unpadded_row_size_in_bytes,
)
from torch import nn

from runtime.config.embeddings import EmbeddingBagConfig
from runtime.cpu import choice, huge_pages, native
from runtime.embeddings.bag_collection import _check_names
from runtime.embeddings.ids import IdCheck
from runtime.embeddings.state_views import load_views
from runtime.sparse.jagged import KeyedJaggedTensor, KeyedTensor, KeySelection

__all__ = [
    "PRECISIONS",
    "stored_dim",
    "QuantEmbeddingBagCollection",
    "UnstorableTable",
    "dequantize_rows",
    "quantize_rows",
    "row_bytes",
]

PRECISIONS = ("fp32", "fp16", "int8", "int4")
_SPARSE_TYPES = {
    "fp32": SparseType.FP32,
    "fp16": SparseType.FP16,
    "int8": SparseType.INT8,
    "int4": SparseType.INT4,
}
_BITS = {"int8": 8, "int4": 4}
_OUTPUT_TYPES = {torch.float32: SparseType.FP32, torch.bfloat16: SparseType.BF16, torch.float16: SparseType.FP16}
_SCALE_BIAS_BYTES = 4  # float16 scale + float16 bias in front of an int8/int4 row
_FP16_MAX = 65504.0
_DIM_MULTIPLE = 4  # fbgemm's inference kernels store rows of whole 4-byte units of values


def check_precision(table: EmbeddingBagConfig, precision: str) -> None:
    """Raise ValueError unless `precision` is one fbgemm can store `table` at."""
    if precision not in _SPARSE_TYPES:
        raise ValueError(
            f"table {table.name!r}: unknown precision {precision!r} (expected one of {', '.join(PRECISIONS)})"
        )


def stored_dim(dim: int) -> int:
    """The width a `dim`-wide table is stored at: the next multiple of 4, as fbgemm's kernels need."""
    return -(-dim // _DIM_MULTIPLE) * _DIM_MULTIPLE


def pad_columns(weight: torch.Tensor, width: int) -> torch.Tensor:
    """`weight` (rows x dim) widened to `width` with copies of each row's last value."""
    extra = width - weight.shape[1]
    return weight if extra == 0 else torch.cat([weight, weight[:, -1:].expand(-1, extra)], dim=1)


def row_bytes(dim: int, precision: str) -> int:
    """Bytes of one stored row (unpadded) of a `dim`-wide table at `precision`."""
    return unpadded_row_size_in_bytes(dim, _SPARSE_TYPES[precision], _SCALE_BIAS_BYTES)


class UnstorableTable(ValueError):
    """A table holds values its precision cannot store: non-finite ones, or beyond float16 where the rows keep it."""


def quantize_rows(weight: torch.Tensor, precision: str, table: str = "?") -> torch.Tensor:
    """fp32 rows (rows x dim) -> stored rows (rows x row_bytes, uint8) in fbgemm's layout."""
    weight = weight.detach().to(torch.float32).contiguous()
    finite = torch.isfinite(weight).all(dim=1)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0])
        raise UnstorableTable(f"table {table!r}: row {row} holds a non-finite value; it cannot be exported")
    if precision == "fp32":
        return weight.view(torch.uint8)
    largest = float(weight.abs().max()) if weight.numel() else 0.0
    if largest > _FP16_MAX and (precision == "fp16" or precision in _BITS):
        # int8 and int4 rows keep their scale and bias (the row's minimum) in float16: fbgemm would write inf
        held = "its values" if precision == "fp16" else "each row's scale and bias"
        raise UnstorableTable(
            f"table {table!r}: a value of magnitude {largest:g} is beyond float16's range "
            f"(±{_FP16_MAX:g}), in which {precision} stores {held}; export the table at fp32"
        )
    if precision == "fp16":
        return weight.to(torch.float16).view(torch.uint8)
    if precision in _BITS:
        # fbgemm puts scale and bias after the codes; its TBE rows want them first.
        fused = torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(weight, _BITS[precision])
        return torch.cat([fused[:, -_SCALE_BIAS_BYTES:], fused[:, :-_SCALE_BIAS_BYTES]], dim=1)
    raise ValueError(f"table {table!r}: unknown precision {precision!r}")


def dequantize_rows(rows: torch.Tensor, precision: str, dim: int) -> torch.Tensor:
    """Stored rows -> the fp32 values the kernel reads (rows x dim)."""
    rows = rows.contiguous()
    if precision == "fp32":
        return rows.view(torch.float32).clone()
    if precision == "fp16":
        return rows.view(torch.float16).to(torch.float32)
    fused = torch.cat([rows[:, _SCALE_BIAS_BYTES:], rows[:, :_SCALE_BIAS_BYTES]], dim=1)
    return torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(fused, _BITS[precision])[:, :dim]


def quantization_step(rows: torch.Tensor, precision: str) -> torch.Tensor | None:
    """The per-row step (scale, rows x 1) of int8/int4 rows; None for float precisions."""
    if precision not in _BITS:
        return None
    return rows[:, :2].contiguous().view(torch.float16).to(torch.float32)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the tables sit in the weight buffer and how the kernel reads them."""

    buffer_bytes: int
    table_offsets: tuple[int, ...]  # byte offset of each table (table order)
    row_alignment: int
    total_dim: int
    max_dims: dict[str, int]  # kernel argument -> widest table of that type


class QuantEmbeddingBagCollection(nn.Module):
    """Inference lookups over tables stored at per-table precisions (see the module docstring).

    `precisions` maps table names to "fp32", "fp16", "int8" or "int4"; a
    string applies to every table; tables it does not name are fp32. The
    weights start at zero: fill them with `quantize_from` (fp32 tables) or
    `load_state_dict` (stored rows). Pooled embeddings come out in
    `output_dtype`: float32, or bfloat16 / float16 for dense blocks that
    compute in it (the kernel accumulates in float32 and rounds once). With
    `bounds_check` (default on), ids and offsets are checked as the native
    kernel pools (or by fbgemm's bounds check before fbgemm's kernel), and a
    batch either refuses raises the ValueError of runtime/embeddings/ids.py
    naming the feature, sample and numbers.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        precisions: Mapping[str, str] | str = "fp32",
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        bounds_check: bool = True,
        output_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if output_dtype not in _OUTPUT_TYPES:
            raise ValueError(f"output_dtype must be torch.float32, bfloat16 or float16, got {output_dtype}")
        if not tables:
            raise ValueError("QuantEmbeddingBagCollection needs at least one table")
        _check_names(tables)
        if isinstance(precisions, str):
            precisions = {t.name: precisions for t in tables}
        unknown = sorted(set(precisions) - {t.name for t in tables})
        if unknown:
            raise ValueError(f"precision given for unknown table {unknown[0]!r}")
        self._tables = list(tables)
        self._precisions = {t.name: precisions.get(t.name, "fp32") for t in tables}
        for table in tables:
            check_precision(table, self._precisions[table.name])
        self._is_weighted = is_weighted
        self.bounds_check = bounds_check
        self._output_type = _OUTPUT_TYPES[output_dtype].as_int()
        self._float_output = output_dtype == torch.float32  # the C kernel writes float32 only
        device = torch.device(device if device is not None else "cpu")

        self._feature_names = [f for t in tables for f in t.feature_names]
        self._feature_dims = [t.embedding_dim for t in tables for _ in t.feature_names]
        stored_dims = [stored_dim(t.embedding_dim) for t in tables for _ in t.feature_names]
        self._padded = stored_dims != self._feature_dims
        self._output_width = sum(self._feature_dims)
        self._feature_tables = [t for t in tables for _ in t.feature_names]
        self._has_mean = any(t.pooling == "mean" for t in tables)
        self._select = KeySelection(self._feature_names)
        self._check = IdCheck(
            self._feature_names,
            [t.describe() for t in self._feature_tables],
            [t.num_embeddings for t in self._feature_tables],
        )

        tbe = self._fbgemm_module(device)
        tbe.initialize_logical_weights_placements_and_offsets()
        self._layout = _Layout(
            buffer_bytes=tbe.host_size if device.type == "cpu" else tbe.dev_size,
            table_offsets=tuple(tbe.weights_physical_offsets),
            row_alignment=tbe.row_alignment,
            total_dim=tbe.total_D,
            max_dims={
                "max_int2_D": tbe.max_int2_D,
                "max_int4_D": tbe.max_int4_D,
                "max_int8_D": tbe.max_int8_D,
                "max_float16_D": tbe.max_float16_D,
                "max_float32_D": tbe.max_float32_D,
            },
        )
        # The kernel's arguments, as buffers so `.to()` and torch.export carry them.
        # The state dict holds per-table entries instead (see `_save_to_state_dict`).
        buffers = {
            # Rows are read at random: on the CPU, huge pages spare a TLB miss per row.
            "weights": huge_pages.zeros(self._layout.buffer_bytes)
            if device.type == "cpu"
            else torch.zeros(self._layout.buffer_bytes, dtype=torch.uint8, device=device),
            "weights_offsets": tbe.weights_offsets.clone(),
            "weights_placements": tbe.weights_placements.clone(),
            "weights_tys": tbe.weights_tys.clone(),
            "D_offsets": tbe.D_offsets.clone(),
            "rows_per_feature": tbe.rows_per_table.clone(),
            "bounds_warning": torch.zeros(1, dtype=torch.int64, device=device),
            "no_bytes": torch.zeros(0, dtype=torch.uint8, device=device),
            "no_locations": torch.zeros(0, dtype=torch.int32, device=device),
            "mean_features": torch.tensor([t.pooling == "mean" for t in self._feature_tables], device=device),
            # The kernel's output columns that are the tables' own (padded tables' end in copies).
            "output_columns": torch.cat(
                [
                    torch.arange(start, start + dim, device=device)
                    for start, dim in zip(tbe.D_offsets[:-1].tolist(), self._feature_dims)
                ]
            ),
        }
        for name, tensor in buffers.items():
            self.register_buffer(name, tensor, persistent=False)
        self._native_layout = native.QuantLayout(
            table_offsets=tbe.weights_offsets.to(torch.int64),
            strides=torch.tensor([self._padded_row_bytes(t) for t in self._feature_tables], dtype=torch.int64),
            types=tbe.weights_tys.to(torch.int64),
            dims=torch.tensor(stored_dims, dtype=torch.int64),
            out_offsets=tbe.D_offsets[:-1].to(torch.int64),
            total_dim=tbe.total_D,
        )
        layout = ",".join(f"{t}x{d}" for t, d in zip(tbe.weights_tys.tolist(), stored_dims))
        self._layout_key = hashlib.sha256(layout.encode()).hexdigest()[:10]  # names the tables in kernel choices
        # (offsets, ids, weighted, checked, threads) -> the 'quant_pool' question's shape key
        self._shapes: dict[tuple[int, int, bool, bool, int], str] = {}

    def _fbgemm_module(self, device: torch.device) -> IntNBitTableBatchedEmbeddingBagsCodegen:
        location = EmbeddingLocation.HOST if device.type == "cpu" else EmbeddingLocation.DEVICE
        return IntNBitTableBatchedEmbeddingBagsCodegen(
            [
                (
                    t.name,
                    t.num_embeddings,
                    stored_dim(t.embedding_dim),
                    _SPARSE_TYPES[self._precisions[t.name]],
                    location,
                )
                for t in self._tables
            ],
            feature_table_map=[i for i, t in enumerate(self._tables) for _ in t.feature_names],
            pooling_mode=PoolingMode.SUM,
            device=device,
            bounds_check_mode=BoundsCheckMode.FATAL,
            output_dtype=SparseType.FP32,
        )

    # -- what the collection holds ------------------------------------------

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._tables)

    def precisions(self) -> dict[str, str]:
        """Table name -> its precision, in table order."""
        return dict(self._precisions)

    def is_weighted(self) -> bool:
        return self._is_weighted

    def feature_names(self) -> list[str]:
        """The output keys, in output order (also the order `forward` wants, to skip a permute)."""
        return list(self._feature_names)

    def table_rows(self) -> dict[str, torch.Tensor]:
        """Each table's stored rows (rows x row bytes, uint8): live views of the weight buffer."""
        views = {}
        for table, offset in zip(self._tables, self._layout.table_offsets):
            stride = self._padded_row_bytes(table)
            block = self.weights[offset : offset + table.num_embeddings * stride]
            width = row_bytes(stored_dim(table.embedding_dim), self._precisions[table.name])
            views[table.name] = block.view(table.num_embeddings, stride)[:, :width]
        return views

    def table_bytes(self) -> dict[str, int]:
        """Bytes each table's stored rows take (what an export writes per table)."""
        return {
            t.name: t.num_embeddings * row_bytes(stored_dim(t.embedding_dim), self._precisions[t.name])
            for t in self._tables
        }

    def dequantized_weights(self) -> dict[str, torch.Tensor]:
        """Each table as the fp32 values the kernel reads (rows x dim), new tensors."""
        return {
            t.name: dequantize_rows(rows, self._precisions[t.name], stored_dim(t.embedding_dim))[:, : t.embedding_dim]
            for t, rows in zip(self._tables, self.table_rows().values())
        }

    def quantization_steps(self) -> dict[str, torch.Tensor | None]:
        """Per table, the step of each int8/int4 row (rows x 1); None for fp32 and fp16."""
        return {name: quantization_step(rows, self._precisions[name]) for name, rows in self.table_rows().items()}

    def layout(self) -> dict[str, Any]:
        """The single-process layout as plain data: tables, byte offsets, features, output columns."""
        columns = list(itertools.accumulate(self._feature_dims, initial=0))
        features = iter(zip(self._feature_names, columns, columns[1:]))
        tables = []
        for table, offset in zip(self._tables, self._layout.table_offsets):
            precision = self._precisions[table.name]
            tables.append(
                {
                    "name": table.name,
                    "rows": table.num_embeddings,
                    "dim": table.embedding_dim,
                    "pooling": table.pooling,
                    "precision": precision,
                    "fbgemm_type": _SPARSE_TYPES[precision].name,
                    **({"stored_dim": stored_dim(table.embedding_dim)} if table.embedding_dim % _DIM_MULTIPLE else {}),
                    "row_bytes": row_bytes(stored_dim(table.embedding_dim), precision),
                    "padded_row_bytes": self._padded_row_bytes(table),
                    "byte_offset": offset,
                    "features": [
                        {"name": name, "columns": [start, stop]}
                        for name, start, stop in itertools.islice(features, len(table.feature_names))
                    ],
                }
            )
        return {
            "kernel": "fbgemm int_nbit_split_embedding_codegen_lookup_function",
            "pooling_mode": "sum (mean tables: per-id weights 1/L)",
            "weights_bytes": self._layout.buffer_bytes,
            "row_alignment": self._layout.row_alignment,
            "output_width": self._output_width,
            "tables": tables,
        }

    def _padded_row_bytes(self, table: EmbeddingBagConfig) -> int:
        size = row_bytes(stored_dim(table.embedding_dim), self._precisions[table.name])
        return -(-size // self._layout.row_alignment) * self._layout.row_alignment

    @torch.no_grad()
    def quantize_from(self, weights: Mapping[str, torch.Tensor]) -> QuantEmbeddingBagCollection:
        """Store fp32 tables (name -> rows x dim) at this collection's precisions; returns self."""
        targets = self.table_rows()
        for table in self._tables:
            if table.name not in weights:
                raise KeyError(f"no weights for table {table.name!r}")
            weight = weights[table.name]
            expected = (table.num_embeddings, table.embedding_dim)
            if tuple(weight.shape) != expected:
                raise ValueError(f"table {table.name!r}: weights of shape {tuple(weight.shape)}, expected {expected}")
            stored = pad_columns(weight, stored_dim(table.embedding_dim))
            targets[table.name].copy_(quantize_rows(stored, self._precisions[table.name], table.name))
        return self

    def to_fbgemm(self) -> IntNBitTableBatchedEmbeddingBagsCodegen:
        """The fbgemm TBE module with these tables and weights (mean tables need weights 1/L;
        padded tables at their stored dim)."""
        tbe = self._fbgemm_module(self.weights.device)
        tbe.initialize_weights()
        for (rows, scale_bias), stored in zip(tbe.split_embedding_weights(), self.table_rows().values()):
            if scale_bias is None:
                rows.copy_(stored)
            else:
                scale_bias.copy_(stored[:, :_SCALE_BIAS_BYTES])
                rows.copy_(stored[:, _SCALE_BIAS_BYTES:])
        return tbe

    # -- lookup ---------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        kjt = self._select(features)
        weights = kjt.weights_or_none() if self._is_weighted else None
        if self._is_weighted and weights is None:
            raise ValueError("QuantEmbeddingBagCollection(is_weighted=True) needs a KeyedJaggedTensor with weights")
        pooled = self.lookup(kjt.values(), kjt.offsets(), weights, kjt)
        return KeyedTensor(self._feature_names, self._feature_dims, pooled)

    def lookup(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        kjt: KeyedJaggedTensor | None = None,
        checked: bool = False,
    ) -> torch.Tensor:
        """Pooled rows (B x output width) for ids in this collection's feature order.

        `checked`: the caller has already checked the ids (the sequence collection checks
        its own features'), so the kernels do not check them again.
        """
        if weights is not None and weights.requires_grad and torch.is_grad_enabled():
            # fbgemm's kernel has no backward and the C one runs outside autograd: refused on both
            # paths alike, so the measured choice never decides whether a gradient is lost.
            raise ValueError(
                "QuantEmbeddingBagCollection: per-id weights that require grad; quantized tables are "
                "forward only (detach the weights, or look up under torch.no_grad())"
            )
        check = self.bounds_check and not checked
        native_kernel = self._float_output and native.applies([self.weights, values], dtype=None)
        shape = self._shape(values, offsets, weights, check) if native_kernel else ""
        if native_kernel and self._choose(values, offsets, weights, kjt, check, shape) == "native":
            threads = self._pool_threads(values, offsets, weights, kjt, check, shape)
            pooled = self._native_pool(values, offsets, weights, kjt, check, threads)
        else:
            pooled = self._fbgemm_pool(values, offsets, weights, kjt, check)
        return pooled.index_select(1, self.output_columns) if self._padded else pooled

    def _choose(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        kjt: KeyedJaggedTensor | None,
        check: bool,
        shape: str,
    ) -> str:
        """'native' or 'fbgemm' at these shapes (`shape`: their `_shape`), both timed with their id
        checks (native's first: an out-of-range id raises there, before fbgemm's kernel could read past
        a table). The key names the C source's hash, so a changed kernel is measured again."""
        return choice.choose(
            "quant_pool",
            shape,
            lambda: {
                "native": lambda: self._native_pool(values, offsets, weights, kjt, check),
                "fbgemm": lambda: self._fbgemm_pool(values, offsets, weights, kjt, check),
            },
        )

    def _shape(self, values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None, check: bool) -> str:
        """The kernel choices' key for these shapes, built once per question (a forward asks at every call)."""
        question = (offsets.numel(), values.numel(), weights is not None, check, torch.get_num_threads())
        shape = self._shapes.get(question)
        if shape is None:
            features = len(self._feature_names)
            shape = self._shapes[question] = (
                f"b{choice.bucket((offsets.numel() - 1) // features)}_ids{choice.bucket(values.numel())}"
                f"_f{features}_{self._layout_key}_c{native.source_tag('quant_pool')}"
                f"{'_weighted' if weights is not None else ''}{'_mean' if self._has_mean else ''}"
                f"{'_checked' if check else ''}_t{torch.get_num_threads()}"
            )
        return shape

    def _pool_threads(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        kjt: KeyedJaggedTensor | None,
        check: bool,
        shape: str,
    ) -> int:
        """The C kernel's team (`shape`: the shapes' `_shape`): one thread where runtime/cpu/native's
        rule (IDS_PER_THREAD) takes one and torch has more, unless the team measured faster at these
        shapes (kernel 'pool_team'). That rule was set on a busy machine, where a team could wait a time
        slice for its second thread; quiet, the thread left spinning by the last GEMM may pool half the
        bags sooner."""
        one, team = native.pool_threads(values.numel()), torch.get_num_threads()
        if one >= team:
            return one
        winner = choice.choose(
            "pool_team",
            shape,
            lambda: {
                "one": lambda: self._native_pool(values, offsets, weights, kjt, check, one),
                "team": lambda: self._native_pool(values, offsets, weights, kjt, check, team),
            },
        )
        return team if winner == "team" else one

    def _bag_weights(
        self, values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The per-id weights, times 1 / bag length for the features pooled by mean."""
        if not self._has_mean:
            return weights
        lengths = offsets[1:] - offsets[:-1]
        per_bag = lengths.clamp(min=1).to(torch.float32).reciprocal()
        batch = lengths.numel() // len(self._feature_names)
        per_bag = torch.where(self.mean_features.repeat_interleave(batch), per_bag, 1.0)
        scale = per_bag.repeat_interleave(lengths, output_size=values.numel())
        return scale if weights is None else weights * scale

    def _native_pool(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        kjt: KeyedJaggedTensor | None,
        check: bool,
        threads: int | None = None,
    ) -> torch.Tensor:
        weights = self._bag_weights(values, offsets, weights)
        rows = self.rows_per_feature if check else None  # the C kernel checks ids as it pools
        pooled = native.quant_pool(self.weights, self._native_layout, values, offsets, weights, rows, threads)
        if pooled is None:
            raise self._bad_id_error(values, offsets, kjt)
        return pooled

    def _fbgemm_pool(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None,
        kjt: KeyedJaggedTensor | None,
        check: bool,
    ) -> torch.Tensor:
        if check:
            self._check_bounds(values, offsets, kjt)
        weights = self._bag_weights(values, offsets, weights)
        dims = self._layout.max_dims
        return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
            dev_weights=self.weights,
            uvm_weights=self.no_bytes,
            weights_placements=self.weights_placements,
            weights_offsets=self.weights_offsets,
            weights_tys=self.weights_tys,
            D_offsets=self.D_offsets,
            total_D=self._layout.total_dim,
            max_int2_D=dims["max_int2_D"],
            max_int4_D=dims["max_int4_D"],
            max_int8_D=dims["max_int8_D"],
            max_float16_D=dims["max_float16_D"],
            max_float32_D=dims["max_float32_D"],
            indices=values,
            offsets=offsets,
            pooling_mode=int(PoolingMode.SUM),
            indice_weights=weights,
            output_dtype=self._output_type,
            lxu_cache_weights=self.no_bytes,
            lxu_cache_locations=self.no_locations,
            row_alignment=self._layout.row_alignment,
            max_float8_D=0,
            fp8_exponent_bits=-1,
            fp8_exponent_bias=-1,
        )

    def _check_bounds(self, values: torch.Tensor, offsets: torch.Tensor, kjt: KeyedJaggedTensor | None) -> None:
        try:
            torch.ops.fbgemm.bounds_check_indices(
                self.rows_per_feature, values, offsets, BoundsCheckMode.FATAL.value, self.bounds_warning, None
            )
            # fbgemm lets negative ids through (it reads them as pruned rows).
            torch._assert_async(values.ge(0).all(), "negative id")
        except RuntimeError as error:
            raise self._bad_id_error(values, offsets, kjt) from error

    def _bad_id_error(self, values: torch.Tensor, offsets: torch.Tensor, kjt: KeyedJaggedTensor | None) -> ValueError:
        """What is wrong with a batch the kernel refused, named by feature and sample."""
        if kjt is None:
            batch = (offsets.numel() - 1) // len(self._feature_names)
            kjt = KeyedJaggedTensor(self._feature_names, values, offsets=offsets, stride=batch)
        return self._check.explain(kjt)

    # -- state: one `<table>.packed` entry per table ---------------------------

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, rows in self.table_rows().items():
            destination[f"{prefix}{name}.packed"] = rows

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        views = {f"{prefix}{name}.packed": rows for name, rows in self.table_rows().items()}

        def mismatch(key: str, source: torch.Tensor, rows: torch.Tensor) -> str | None:
            if source.dtype == torch.uint8 and source.shape == rows.shape:
                return None
            return (
                f"size mismatch for {key}: copying stored rows of {source.dtype} {tuple(source.shape)} "
                f"from the checkpoint, the shape in the current model is torch.uint8 {tuple(rows.shape)}."
            )

        load_views(views, state_dict, prefix, strict, missing_keys, unexpected_keys, error_msgs, mismatch)

    def extra_repr(self) -> str:
        tables = ", ".join(
            f"{t.name}({t.num_embeddings}x{t.embedding_dim}, {t.pooling}, {self._precisions[t.name]})"
            for t in self._tables
        )
        return f"tables=[{tables}]"
