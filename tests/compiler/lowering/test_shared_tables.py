"""A weighted or position-weighted bag on a table that also serves a sequence: it compiles, and it
pools what the same bag on a table of its own pools."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compiler.codegen.emit import emit
from compiler.pipeline import Options, compile_spec
from runtime.train.worker import load_module

SHARED = """\
version: 1
name: shared
features:
  sparse:
    - {name: a, table: ta, max_ids_per_sample: 4, weighted: true}
    - {name: s, table: ta, pooling: none, max_length: 5}
tables:
  - {name: ta, num_embeddings: 37, dim: 8}
model:
  pool: {type: sequence_pool, input: sparse.s}
  top: {type: mlp, input: [sparse.a, pool], layers: [8, 1]}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 16
"""
# The same model with the bag on a table of its own (the fused TBE's weighted pooling).
OWN = SHARED.replace("{name: a, table: ta,", "{name: a, table: tb,").replace(
    "  - {name: ta, num_embeddings: 37, dim: 8}",
    "  - {name: ta, num_embeddings: 37, dim: 8}\n  - {name: tb, num_embeddings: 37, dim: 8}",
)


def _module(tmp_path: Path, name: str, text: str):
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(text)
    return load_module(str(emit(compile_spec(str(spec), Options(world_size=1))).write(tmp_path / name)[0]))


@pytest.mark.parametrize("weights", ["weighted", "position_weights"])
def test_a_weighted_bag_on_a_sequences_table_pools_as_on_its_own_table(tmp_path: Path, weights: str) -> None:
    shared, own = SHARED, OWN
    if weights == "position_weights":
        shared, own = (t.replace("weighted: true", "position_weights: true") for t in (SHARED, OWN))
    modules = {name: _module(tmp_path, name, text) for name, text in (("shared", shared), ("own", own))}
    torch.manual_seed(0)
    models = {name: module.build() for name, module in modules.items()}
    state = models["shared"].state_dict()  # world size 1: whole tables under their names
    models["own"].load_state_dict(
        {
            **state,
            "sparse_arch.tb.weight": state["sparse_arch.ta.weight"],
            "sparse_arch.tb.momentum1": state["sparse_arch.ta.momentum1"],
        }
    )
    batch = modules["shared"].synthetic_batch(16, step=3)
    if weights == "weighted":
        assert batch.sparse["a"].weights().abs().sum() > 0 and not torch.all(batch.sparse["a"].weights() == 1)
    with torch.no_grad():
        outputs = {name: model(batch.dense, batch.sparse)["click"] for name, model in models.items()}
    torch.testing.assert_close(outputs["shared"], outputs["own"], rtol=1e-6, atol=1e-6)
