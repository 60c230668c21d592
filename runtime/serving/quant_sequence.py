"""QuantEmbeddingCollection: sequence (unpooled) lookups of inference tables at fp32, fp16, int8 or int4.

The serving counterpart of `runtime.embeddings.sequence_collection.EmbeddingCollection`:
ids in a KeyedJaggedTensor in, and out, per feature, a `JaggedTensor` of the
looked-up rows [sum(L), dim] with the feature's lengths (table order, then
each table's features), forward only. Tables of different widths and
precisions sit in one collection, and one table may serve several features.

Storage is `QuantEmbeddingBagCollection`'s, unchanged (fbgemm's IntNBit row
layout, the same precisions and error bounds, state dict `<table>.packed`):
this collection is one, whose bag features are its tables, each read one id
per bag, as the training collection reads its tables. A table's slot holds
the ids of all its features, one per bag; slots of one call need equal bag
counts, so shorter ones end in empty bags (zero rows, never read back). One
pooled call returns [most ids of a table, sum of the dims]; a table's rows are
its columns' first rows. Pooling one id is the row itself, so fp32 tables give
the training collection's rows bit for bit.

Why not fbgemm's `PoolingMode.NONE`: on this CPU build
`IntNBitTableBatchedEmbeddingBagsCodegen` refuses tables of different widths
("Mixed dimension tables are only supported for pooling tables"), and its
kernel called on a mixed layout reads every row at the widest width. One
NONE module per width works, but measured against this layout (batch 512, a
1M x 64 item table with a 1-50 history and a target, a 1000 x 16 table with a
1-20 history; 19,268 ids; fastest of 30 calls, 1 thread) it is no faster:
fp32 0.83 ms against 0.81 ms, int8 0.66 ms against 0.56 ms (2 threads: 0.80 /
0.69 and 0.62 / 0.42). The native quant_pool kernel is 2-3x slower than
fbgemm's on single-id bags; runtime/cpu/choice.py picks between them by
timing, as for the bag collection.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from runtime.config.embeddings import EmbeddingConfig
from runtime.embeddings.bag_collection import _check_names
from runtime.embeddings.ids import IdCheck
from runtime.embeddings.sequence_collection import _slot_offsets
from runtime.serving.quant_embedding import QuantEmbeddingBagCollection
from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeySelection

__all__ = ["QuantEmbeddingCollection"]


class QuantEmbeddingCollection(QuantEmbeddingBagCollection):
    """Sequence lookups over tables stored at per-table precisions (see the module docstring).

    `precisions`, `output_dtype` and the weights (`quantize_from`,
    `load_state_dict`, `table_rows`, `dequantized_weights`, ...) as for
    `QuantEmbeddingBagCollection`. `forward(features)` returns
    `{feature: JaggedTensor}` in `feature_names()` order; the KeyedJaggedTensor
    may hold other keys, in any order, and its weights are ignored. With
    `bounds_check` (default on) the batch's layout and ids are checked first,
    and a bad one raises the ValueError of runtime/embeddings/ids.py naming the
    feature, the sample and the numbers.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingConfig],
        precisions: Mapping[str, str] | str = "fp32",
        device: torch.device | str | None = None,
        bounds_check: bool = True,
        output_dtype: torch.dtype = torch.float32,
    ) -> None:
        if not tables:
            raise ValueError("QuantEmbeddingCollection needs at least one table")
        _check_names(list(tables))
        super().__init__(
            [t.lookup_slot() for t in tables],
            precisions,
            device=device,
            bounds_check=bounds_check,
            output_dtype=output_dtype,
        )
        self._sequence_tables = list(tables)
        self._rows_dtype = output_dtype
        self._sequence_features = [f for t in tables for f in t.feature_names]
        self._sequence_select = KeySelection(self._sequence_features)
        self._ids = IdCheck(
            self._sequence_features,
            [t.describe() for t in tables for _ in t.feature_names],
            [t.num_embeddings for t in tables for _ in t.feature_names],
        )

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._sequence_tables)

    def feature_names(self) -> list[str]:
        """The output keys, in output order (also the order `forward` wants, to skip a permute)."""
        return list(self._sequence_features)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:  # type: ignore[override]
        if self.bounds_check:
            features = self._ids(features)
        kjt = self._sequence_select(features)
        values, length_per_key = kjt.values(), kjt.length_per_key()
        slot_rows, key = [], 0
        for table in self._sequence_tables:
            slot_rows.append(sum(length_per_key[key : key + len(table.feature_names)]))
            key += len(table.feature_names)
        if sum(slot_rows):
            offsets = _slot_offsets(slot_rows, values.device).to(values.dtype)
            rows = self.lookup(values, offsets, None, checked=True)
        else:
            rows = self.weights.new_zeros((0, self._output_width), dtype=self._rows_dtype)
        blocks, key, column = [], 0, 0
        for table, count in zip(self._sequence_tables, slot_rows):
            width, features_in_table = table.embedding_dim, len(table.feature_names)
            table_rows = rows[:count, column : column + width]
            blocks.extend(torch.split(table_rows, length_per_key[key : key + features_in_table]))
            column += width
            key += features_in_table
        batch, lengths = kjt.stride(), kjt.lengths()
        return {
            name: JaggedTensor(block, lengths=lengths[k * batch : (k + 1) * batch])
            for k, (name, block) in enumerate(zip(self._sequence_features, blocks))
        }

    def layout(self) -> dict[str, Any]:
        """The single-process layout as plain data: tables, byte offsets, the features each serves."""
        layout = super().layout()
        layout["pooling_mode"] = "none (one id per bag, sum pooling)"
        for table, entry in zip(self._sequence_tables, layout["tables"]):
            entry["pooling"] = "none"
            entry["features"] = [{"name": name} for name in table.feature_names]
        return layout

    def extra_repr(self) -> str:
        precisions = self.precisions()
        tables = ", ".join(
            f"{t.name}({t.num_embeddings}x{t.embedding_dim}, {precisions[t.name]})" for t in self._sequence_tables
        )
        return f"tables=[{tables}]"
