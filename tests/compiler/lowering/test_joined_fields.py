"""target_attention over several sequence fields of one history, joined position by position.

TorchEasyRec's DIN reads a sequence group (item ids, categories, brands of
the same positions) as one [B, L, sum D] sequence and its query group as one
[B, sum D] vector: one attention over the joined width, not one per field.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from compiler.codegen.emit import emit
from compiler.pipeline import compile_spec
from runtime.modules.blocks.target_attention import TargetAttention, join_fields
from runtime.train.worker import load_module

SPEC = """\
version: 1
name: din_fields
features:
  sparse:
    - {name: item, table: items}
    - {name: cat, table: cats}
    - {name: brand, table: brands}
    - {name: hist_item, table: items, pooling: none, max_length: 10}
    - {name: hist_cat, table: cats, pooling: none, max_length: 10}
    - {name: hist_brand, table: brands, pooling: none, max_length: 10}
tables:
  - {name: items, num_embeddings: 50, dim: 16}
  - {name: cats, num_embeddings: 10, dim: 16}
  - {name: brands, num_embeddings: 20, dim: 16}
model:
  din: {type: target_attention, input: [sparse.hist_item, sparse.hist_cat, sparse.hist_brand],
        query: [sparse.item, sparse.cat, sparse.brand], normalize: softmax}
  top: {type: mlp, input: [din, sparse.item], layers: [8, 1]}
heads:
  - {name: click, input: top, loss: bce}
"""


def test_three_16_wide_fields_make_one_48_wide_attention(tmp_path: Path) -> None:
    spec = tmp_path / "din_fields.yaml"
    spec.write_text(SPEC)
    compiled = compile_spec(str(spec))
    din = compiled.ir.block("din")
    assert din.width == 48 and [item.name for item in din.inputs] == ["hist_item", "hist_cat", "hist_brand"]
    assert [item.name for item in (din.op.query, *din.op.query_fields)] == ["item", "cat", "brand"]
    model = load_module(str(emit(compiled).write(tmp_path / "build")[0])).build()
    assert isinstance(model.din, TargetAttention) and model.din.dim == 48
    assert model.top.in_features == 48 + 16

    # The joined computation is the attention over the concatenated fields and query.
    generator = torch.Generator().manual_seed(0)
    fields = [torch.randn(3, 10, 16, generator=generator) for _ in range(3)]
    queries = [torch.randn(3, 16, generator=generator) for _ in range(3)]
    lengths = torch.tensor([4, 0, 10])
    got = model.din(torch.cat(queries, dim=1), join_fields(fields, [lengths] * 3), lengths)
    reference = TargetAttention(48, (80, 40), "sigmoid", normalize="softmax")
    reference.load_state_dict(model.din.state_dict())
    torch.testing.assert_close(got, reference(torch.cat(queries, 1), torch.cat(fields, 2), lengths), atol=0, rtol=0)


def test_fields_of_different_lengths_in_a_sample_are_named() -> None:
    fields = [torch.zeros(2, 4, 3), torch.zeros(2, 4, 3)]
    message = (
        "target_attention: the joined sequences have different lengths in sample 1 (2 and 3); "
        "each field must describe the same positions"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        join_fields(fields, [torch.tensor([1, 2]), torch.tensor([1, 3])])
