"""Two ranks (gloo, loopback) train a compiled retrieval model exactly as one process does.

Each case is a small spec compiled twice, for one rank and for two, its item
table placed by a constraint: a two-tower model with a data_parallel and
with a row_wise movie table, and a next-item model with a table_wise
sequence table (whose ranks hold different numbers of positions, so the
loss's normalisation by the global count matters). Both negatives are on:
in-batch ones come from the global batch (all-gathered), uniform ones are
drawn alike on every rank and looked up through the same sharded table as
the positives (or, per position, drawn for each global position); a two-tower model whose item
tower reads three attributes looks the negatives' attributes up in the item catalogue both ranks fill
alike, and every item's vector (item_catalogue) agrees. The next-item
model with generative-recommenders' options also checks that the keyed dropout
of hstu and transformer layers draws what one process draws. After STEPS steps on the same global batches (synthetic,
sliced per rank), the global losses agree to a relative 1e-5 and every table
row, dense parameter and loss buffer to an absolute 1e-5; also when the two
ranks train through the pipeline (the next batch's input_dist ahead).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from compiler.codegen.emit import emit
from compiler.pipeline import Options, compile_spec
from runtime.sharding import distribute_dense
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.context import RunContext
from runtime.train.loop import train
from runtime.train.options import TrainOptions
from runtime.train.process_group import close_process_group, init_process_group
from runtime.train.worker import load_module
import rendezvous

WORLD, STEPS, BATCH = 2, 3, 16

TWO_TOWER = """\
version: 1
name: {name}
features:
  sparse:
    - {{name: user_id, num_embeddings: 60, dim: 8}}
    - {{name: movie_id, num_embeddings: 40, dim: 8}}
model:
  user_tower: {{type: mlp, input: sparse.user_id, layers: [16, 8]}}
  item_tower: {{type: mlp, input: sparse.movie_id, layers: [16, 8]}}
heads:
  - {{name: match, loss: sampled_softmax, input: user_tower, item: item_tower, negatives: {{in_batch: true, uniform: 12}},
     logq: true, temperature: 0.2, normalize: true}}
training:
  batch_size: {batch}
  dense_optimizer: {{type: sgd, lr: 0.1}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
sharding:
  constraints:
    movie_id: {{sharding_types: [{sharding}]}}
"""

NEXT_ITEM = """\
version: 1
name: {name}
features:
  sparse:
    - {{name: history, num_embeddings: 30, dim: 8, pooling: none, max_length: 6}}
model:
  encoder: {{type: transformer, input: sparse.history, num_heads: 1, ffn_dim: 8, norm: pre, causal: true}}
heads:
  - {{name: next_item, loss: sampled_softmax, input: encoder, item: sparse.history,
     negatives: {{in_batch: true, uniform: 10}}, temperature: 0.2, normalize: true}}
training:
  batch_size: {batch}
  dense_optimizer: {{type: sgd, lr: 0.1}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
sharding:
  constraints:
    history: {{sharding_types: [{sharding}]}}
"""

# generative-recommenders' options: keyed dropout in an hstu and a SASRec-arranged transformer, and negatives
# drawn per position (whose lookups differ in number between the ranks, padded to the larger).
NEXT_ITEM_LOCAL = """\
version: 1
name: {name}
features:
  sparse:
    - {{name: history, num_embeddings: 30, dim: 8, pooling: none, max_length: 6}}
  timestamps:
    - {{name: history_time, sequence: history}}
model:
  stack: {{type: hstu, input: sparse.history, timestamps: timestamps.history_time, num_heads: 2, attention_dim: 4,
          linear_dim: 4, scale_input: true, positions: learned, input_dropout: 0.2, dropout: 0.3}}
  encoder: {{type: transformer, input: stack, num_heads: 2, ffn_dim: 8, norm: sasrec, norm_affine: false, causal: true,
            dropout: 0.2, input_dropout: 0.1}}
heads:
  - {{name: next_item, loss: sampled_softmax, input: encoder, item: sparse.history,
     negatives: {{uniform: 10, per_query: true}}, temperature: 0.2, normalize: true}}
training:
  batch_size: {batch}
  dense_optimizer: {{type: sgd, lr: 0.1}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
sharding:
  constraints:
    history: {{sharding_types: [{sharding}]}}
"""

# DSSM's item tower: the item id and three attributes, each table on another sharding type. The uniform
# negatives' attributes come from the item catalogue, which both ranks fill from the global batch's rows.
ATTRIBUTES = """\
version: 1
name: {name}
features:
  sparse:
    - {{name: user_id, num_embeddings: 60, dim: 8}}
    - {{name: item_id, num_embeddings: 40, dim: 8}}
    - {{name: category, num_embeddings: 7, dim: 8}}
    - {{name: brand, num_embeddings: 11, dim: 8, pooling: mean}}
    - {{name: price_bucket, num_embeddings: 5, dim: 8}}
model:
  user_tower: {{type: mlp, input: sparse.user_id, layers: [16, 8]}}
  item_tower: {{type: mlp, input: [sparse.item_id, sparse.category, sparse.brand, sparse.price_bucket],
                layers: [16, 8]}}
heads:
  - {{name: match, loss: sampled_softmax, input: user_tower, item: item_tower,
     negatives: {{in_batch: true, uniform: 12}},
     item_attributes: {{features: [category, brand, price_bucket]}}, logq: true, temperature: 0.2, normalize: true}}
training:
  batch_size: {batch}
  dense_optimizer: {{type: sgd, lr: 0.1}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.1}}
sharding:
  constraints:
    item_id: {{sharding_types: [{sharding}]}}
    category: {{sharding_types: [data_parallel]}}
    brand: {{sharding_types: [table_wise]}}
    price_bucket: {{sharding_types: [row_wise]}}
"""

# case -> (spec, the item table's sharding type, pipeline depth of the two ranks)
CASES = {
    "two_tower_data_parallel": (TWO_TOWER, "data_parallel", 1),
    "two_tower_row_wise": (TWO_TOWER, "row_wise", 1),
    "two_tower_row_wise_pipelined": (TWO_TOWER, "row_wise", 2),
    "next_item_table_wise": (NEXT_ITEM, "table_wise", 1),
    "next_item_local_row_wise": (NEXT_ITEM_LOCAL, "row_wise", 1),
    "item_attributes_row_wise_pipelined": (ATTRIBUTES, "row_wise", 2),
}


def compiled(name: str, world_size: int, out: Path) -> str:
    """The generated module of case `name` for `world_size` ranks; its path."""
    template, sharding, _ = CASES[name]
    spec = out / f"{name}.yaml"
    spec.write_text(template.format(name=name, batch=BATCH, sharding=sharding))
    written = emit(compile_spec(str(spec), Options(world_size=world_size))).write(out / f"ws{world_size}")
    return str(written[0])


def run(path: str, rank: int, world_size: int, group: Any, depth: int = 1) -> dict[str, Any]:
    """STEPS steps of the module at `path` on this rank's slices; the global losses and full state.

    With `depth` > 1 through the training pipeline: batch i+1's ids all-to-alls are in flight while
    batch i's loss looks its uniform negatives up through the same tables.
    """
    module = load_module(path)
    torch.manual_seed(0)
    model = module.build(process_group=group)
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    wrapped = distribute_dense(model, group)
    batches = (module.synthetic_batch(BATCH, step=i, rank=rank, world_size=world_size) for i in range(STEPS))
    options = TrainOptions(module=path, steps=STEPS, batch_size=BATCH, pipeline=True, pipeline_depth=depth)
    summary = train(RunContext(options, module.INPUTS, process_group=group), wrapped, batches, optimizer)
    result = {"losses": summary.losses, "state": model.full_state_dict()}
    if hasattr(model, "item_attributes"):  # every item's vector, through the catalogue and the sharded tables
        result["catalogue"] = model.item_catalogue()
    return result


def _rank(rank: int, port: int, paths: dict[str, str], out: str) -> None:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo",
        store=rendezvous.client(port, WORLD, datetime.timedelta(seconds=120)),
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    group = torch.distributed.group.WORLD
    results = {name: run(path, rank, WORLD, group, CASES[name][2]) for name, path in paths.items()}
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    del results
    close_process_group()


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("retrieval_ranks")
    paths = {name: compiled(name, WORLD, out) for name in CASES}
    with rendezvous.hosted_store() as port:
        mp.spawn(_rank, args=(port, paths, str(out)), nprocs=WORLD)
    return torch.load(out / "results.pt", weights_only=False)


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_train_a_retrieval_model_like_one_process(
    distributed: dict[str, Any], name: str, tmp_path: Path
) -> None:
    one = run(compiled(name, 1, tmp_path), rank=0, world_size=1, group=None)
    got = distributed[name]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(one["losses"]), rtol=1e-5, atol=0)
    assert sorted(got["state"]) == sorted(one["state"])
    for key, value in one["state"].items():
        torch.testing.assert_close(got["state"][key], value, rtol=0, atol=1e-5, msg=key)
    assert got.keys() == one.keys()
    if "catalogue" in one:
        torch.testing.assert_close(got["catalogue"], one["catalogue"], rtol=0, atol=1e-5)
        table = one["state"]["item_attributes.table"]
        assert (table >= 0).all(dim=1).sum() > 20 and (table < 0).all(dim=1).any()  # items seen, and items not
