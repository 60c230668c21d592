"""Sequence features and the sequence blocks in the IR (compiler/spec/build.py, values.py, semantic.py).

The diagnostics of sequence specs are pinned by tests/specs/invalid/sequence_*.yaml;
these tests check what a valid sequence spec resolves to.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from compiler.ir import Gru, Hstu, Input, SequencePool, TargetAttention, Transformer
from compiler.spec.load import load
from compiler.spec.validate import validate

SPEC = """\
version: 1
name: sequences
features:
  sparse:
    - {name: user, num_embeddings: 100, dim: 8}
    - {name: item, table: items}
    - {name: history, table: items, pooling: none, max_length: 5}
    - {name: pages, num_embeddings: 30, dim: 8, pooling: none, max_length: 7, keep: start}
  timestamps:
    - {name: history_time, sequence: history}
tables:
  - {name: items, num_embeddings: 50, dim: 8, pooling: mean}
model:
  din: {type: target_attention, input: sparse.history, query: sparse.item}
  encoder: {type: transformer, input: sparse.history, prepend: [sparse.item, sparse.user], num_heads: 2, ffn_dim: 16}
  target: {type: sequence_pool, input: encoder, mode: first}
  recent: {type: hstu, input: sparse.history, timestamps: timestamps.history_time, num_heads: 2,
           attention_dim: 4, linear_dim: 4}
  again: {type: hstu, input: recent, timestamps: timestamps.history_time, num_heads: 1,
          attention_dim: 4, linear_dim: 4, num_layers: 2, num_buckets: 16}
  last: {type: sequence_pool, input: again, mode: last}
  pages_mean: {type: sequence_pool, input: sparse.pages}
  top: {type: mlp, input: [sparse.*, din, target, last, pages_mean], layers: [1]}
heads:
  - {name: click, input: top, loss: bce}
"""


def resolve(tmp_path: Path, text: str = SPEC):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return validate(load(str(path)))


def test_sequence_features_have_max_length_keep_and_timestamps(tmp_path: Path) -> None:
    ir = resolve(tmp_path)
    features = {f.name: (f.table, f.max_length, f.keep, f.ids_per_sample, f.fixed_ids) for f in ir.sparse}
    assert features == {
        "user": ("user", None, "end", 1, True),
        "item": ("items", None, "end", 1, True),
        "history": ("items", 5, "end", 5, False),
        "pages": ("pages", 7, "start", 7, False),
    }
    assert [(t.name, t.sequence) for t in ir.timestamps] == [("history_time", "history")]
    assert [t.name for t in ir.sequence_tables()] == ["items", "pages"]
    assert ir.table("items").pooling == "mean"  # the pooled `item` is pooled by its table's mode
    assert ir.table("pages").pooling == "sum"


def test_sparse_star_names_the_pooled_features_only(tmp_path: Path) -> None:
    top = resolve(tmp_path).block("top")
    assert [i.ref() for i in top.inputs] == ["sparse.user", "sparse.item", "din", "target", "last", "pages_mean"]
    assert top.inputs[0] == Input("sparse", "user", 8)


def test_sequence_blocks_resolve_their_ops_widths_and_lengths(tmp_path: Path) -> None:
    ir = resolve(tmp_path)
    din, encoder, target, recent, again = (ir.block(n) for n in ("din", "encoder", "target", "recent", "again"))
    assert din.inputs == (Input("sparse", "history", 8, None, 5),)
    assert din.op == TargetAttention(Input("sparse", "item", 8), (80, 40), "sigmoid")
    assert (din.width, din.length) == (8, None)
    assert encoder.op == Transformer(
        num_layers=1,
        num_heads=2,
        ffn_dim=16,
        norm="post",
        causal=False,
        positions="learned",
        activation="relu",
        prepend=(Input("sparse", "item", 8), Input("sparse", "user", 8)),
    )
    assert (encoder.width, encoder.length) == (8, 7)  # two vectors before 5 positions
    assert target.op == SequencePool("first") and target.inputs == (Input("block", "encoder", 8, None, 7),)
    stamps = Input("timestamps", "history_time", 1, None, 5)
    assert recent.op == Hstu(1, 2, 4, 4, 128, stamps)
    assert again.op == Hstu(2, 1, 4, 4, 16, stamps)  # an hstu over an hstu keeps the positions
    assert (again.width, again.length) == (8, 5)
    assert ir.block("pages_mean").op == SequencePool("mean")


def test_a_data_column_may_feed_a_timestamps_feature(tmp_path: Path) -> None:
    spec = tmp_path / "timed.yaml"
    spec.write_text(
        textwrap.dedent("""\
        version: 1
        name: timed
        features:
          sparse:
            - {name: history, table: item, pooling: none, max_length: 4}
          timestamps:
            - {name: history_time, sequence: history}
        tables:
          - {name: item, num_embeddings: 64, dim: 8}
        model:
          encoder: {type: hstu, input: sparse.history, timestamps: timestamps.history_time, num_heads: 1,
                    attention_dim: 8, linear_dim: 8, num_buckets: 16}
        heads:
          - {name: next_item, loss: sampled_softmax, input: encoder, item: sparse.history, negatives: {uniform: 4}}
        data: {reader: csv, path: s.csv, columns: {items: history, times: history_time}}
        """)
    )
    assert validate(load(str(spec))).data.columns == (("items", "history"), ("times", "history_time"))


GRU_SPEC = """\
version: 1
name: recurrent
features:
  sparse:
    - {name: item, table: items}
    - {name: history, table: items, pooling: none, max_length: 5}
tables:
  - {name: items, num_embeddings: 50, dim: 8}
model:
  interests: {type: gru, input: sparse.history, hidden_size: 6, num_layers: 2}
  evolution: {type: gru, input: interests, query: sparse.item, attention_softmax: false}
  final: {type: sequence_pool, input: evolution, mode: last}
  top: {type: mlp, input: [final, sparse.item], layers: [4, 1], activation: dice}
heads:
  - {name: click, input: top, loss: bce}
"""


def test_gru_blocks_give_sequences_of_their_hidden_width_and_take_a_query_for_dien(tmp_path: Path) -> None:
    ir = resolve(tmp_path, GRU_SPEC)
    interests, evolution, final = (ir.block(n) for n in ("interests", "evolution", "final"))
    assert interests.op == Gru(hidden_size=6, num_layers=2, query=None, attention="bilinear", attention_softmax=True)
    assert (interests.width, interests.length) == (6, 5)
    assert evolution.inputs == (Input("block", "interests", 6, None, 5),)
    assert evolution.op == Gru(6, 1, Input("sparse", "item", 8), "bilinear", False)
    assert (evolution.width, evolution.length, final.width) == (6, 5, 6)
    assert ir.block("top").op.activation == "dice"
