"""specs/bst.yaml with `positions: concat`: the positions widen the encoder, its pooled target and the MLP's input."""

from __future__ import annotations

from pathlib import Path

import torch

from compiler.codegen.emit import emit
from compiler.pipeline import compile_spec
from runtime.train.worker import load_module

REPO = Path(__file__).resolve().parents[3]


def test_concatenated_positions_reach_every_reader(tmp_path: Path) -> None:
    text = (REPO / "specs" / "bst.yaml").read_text()
    assert "positions: learned}" in text
    spec = tmp_path / "bst.yaml"
    spec.write_text(text.replace("positions: learned}", "positions: concat, position_dim: 8}"))
    compiled = compile_spec(str(spec))
    assert compiled.ir.block("encoder").width == 32 + 8 and compiled.ir.block("target").width == 40
    module = load_module(str(emit(compiled).write(tmp_path / "build")[0]))
    model = module.build()
    assert model.encoder.positions.shape[1] == 8 and model.encoder.width == 40
    batch = module.synthetic_batch(4, step=0, rank=0, world_size=1)
    out = model(batch.dense, batch.sparse)
    assert all(torch.isfinite(value).all() for value in out.values())
