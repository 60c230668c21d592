"""The IR of sampled_softmax heads (compiler/spec/retrieval.py).

Their diagnostics are pinned by tests/specs/invalid/retrieval_*.yaml.
"""

from __future__ import annotations

from pathlib import Path

from compiler.ir import Input, Retrieval
from compiler.spec.load import load
from compiler.spec.validate import validate

TWO_TOWER = """\
version: 1
name: tt
features:
  sparse:
    - {name: user_id, num_embeddings: 100, dim: 8}
    - {name: movie_id, num_embeddings: 50, dim: 8}
model:
  user_tower: {type: mlp, input: sparse.user_id, layers: [16, 8]}
  item_tower: {type: mlp, input: sparse.movie_id, layers: [16, 8]}
heads:
  - name: match
    loss: sampled_softmax
    input: user_tower
    item: item_tower
    negatives: {in_batch: true, uniform: 20}
    logq: true
    temperature: 0.05
    normalize: true
    metrics: [recall@10, ndcg@5, mrr, hit_rate@10]
"""

NEXT_ITEM = """\
version: 1
name: ni
features:
  sparse:
    - {name: history, num_embeddings: 40, dim: 8, pooling: none, max_length: 6}
model:
  encoder: {type: transformer, input: sparse.history, num_heads: 1, ffn_dim: 8, causal: true}
heads:
  - {name: next_item, loss: sampled_softmax, input: encoder, item: sparse.history}
"""


def build(tmp_path: Path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return validate(load(str(path)))


def test_two_tower_head_resolves_its_item_tower_feature_table_and_settings(tmp_path: Path) -> None:
    ir = build(tmp_path, TWO_TOWER)
    (head,) = ir.heads
    assert (head.loss, head.input, head.label, head.num_classes) == (
        "sampled_softmax",
        Input("block", "user_tower", 8),
        "movie_id",
        1,
    )
    assert head.metrics == ("recall@10", "ndcg@5", "mrr", "hit_rate@10")
    assert head.retrieval == Retrieval(
        item=Input("block", "item_tower", 8),
        item_feature="movie_id",
        item_table="movie_id",
        in_batch=True,
        uniform=20,
        logq=True,
        temperature=0.05,
        normalize=True,
        ks=(5, 10),
        next_item=False,
    )
    # the towers feed the head: their last layer is linear
    assert [block.op.final_activation for block in ir.blocks] == ["none", "none"]


def test_next_item_head_reads_the_querys_own_sequence_with_default_settings(tmp_path: Path) -> None:
    ir = build(tmp_path, NEXT_ITEM)
    (head,) = ir.heads
    assert head.input == Input("block", "encoder", 8, None, 6)
    assert head.metrics == ("recall@10", "ndcg@10")
    assert head.retrieval == Retrieval(
        item=Input("sparse", "history", 8, None, 6),
        item_feature="history",
        item_table="history",
        in_batch=True,
        uniform=0,
        logq=False,
        temperature=1.0,
        normalize=False,
        ks=(10,),
        next_item=True,
        mask_seen=True,
    )
