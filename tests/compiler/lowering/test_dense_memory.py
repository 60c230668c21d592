"""compiler/lowering/dense_memory.py: every rank holds the dense blocks, their gradients and
the dense optimizer's state beside its table shards.

The bound is exact: with the memory per rank set to the tables' bytes plus the
dense bytes the spec compiles, one byte less is refused at the largest block.
The refused spec's full text is pinned by tests/specs/invalid/dense_memory.yaml.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.diagnostics import CompileError
from compiler.pipeline import Options, compile_spec
from compiler.planner.planner import plan, topology_from_ir
from compiler.planner.topology import format_bytes
from compiler.spec.load import load
from compiler.spec.validate import validate

SPEC = """\
version: 1
name: small
features:
  dense:
    - {{name: num, size: 5}}
  sparse:
    - {{name: user, num_embeddings: 100, dim: 8}}
model:
  bottom: {{type: mlp, input: dense.num, layers: [8], norm: batch}}
  top: {{type: mlp, input: [bottom, sparse.user], layers: [8, 1]}}
heads:
  - {{name: click, input: top, loss: bce}}
training:
  batch_size: 8
  dense_optimizer: {{type: {optimizer}, lr: 0.1}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
"""
TOP = 4 * ((16 * 8 + 8) + (8 * 1 + 1))  # float32 weights and biases of its two layers
PARAMETERS = 4 * (5 * 8 + (8 + 8)) + TOP  # bottom's layer (no bias: the norm's shift is one) and its norm
BUFFERS = 4 * (8 + 8) + 8  # the batch norm's running mean and variance, and its int64 batch count


@pytest.mark.parametrize(("optimizer", "copies"), [("sgd", 2), ("adagrad", 3), ("adam", 4)])
def test_the_dense_blocks_fit_to_the_byte(tmp_path: Path, optimizer: str, copies: int) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SPEC.format(optimizer=optimizer))
    ir = validate(load(str(path)))
    tables = plan(ir, topology_from_ir(ir)).ranks[0].bytes_used
    fits = tables + copies * PARAMETERS + BUFFERS
    compile_spec(str(path), Options(memory_per_rank=fits))
    with pytest.raises(CompileError) as caught:
        compile_spec(str(path), Options(memory_per_rank=fits - 1))
    (diagnostic,) = caught.value.diagnostics
    need, cap = format_bytes(fits - tables), format_bytes(fits - 1)
    assert str(diagnostic) == (
        f"{path}:10:3: error: model.top: the dense blocks need at least {need} on every rank "
        f"({format_bytes(PARAMETERS)} of parameters, held {copies} times with their gradients and {optimizer}'s "
        f"state), but rank 0 has {cap}, {format_bytes(tables)} of them for its table shards; "
        f"the largest block is 'top' ({format_bytes(TOP)})"
    )
