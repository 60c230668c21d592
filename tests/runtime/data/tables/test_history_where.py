"""A history with `where`: only the training rows whose column equals the value enter it (the liked items),
learned from the training rows only, so a held-out row's label changes nothing in any history."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from compiler.lowering.instantiate import model_inputs
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.loader import epoch_batches
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.learn import learn_features

SPEC = """\
version: 1
name: liked
features:
  sparse:
    - {name: user, num_embeddings: 8, dim: 4, vocabulary: {}}
    - {name: item, table: items, vocabulary: {}}
    - {name: seen, table: items, pooling: none, max_length: 3, history: {of: item, by: user, time: ts}}
    - {name: liked, table: items, pooling: none, max_length: 3,
       history: {of: item, by: user, time: ts, where: {column: label, equals: 1}}}
tables:
  - {name: items, num_embeddings: 16, dim: 4}
model:
  top: {type: mlp, input: [sparse.user, sparse.item], layers: [1]}
heads:
  - {name: click, input: top, loss: bce}
training: {batch_size: 4}
data:
  reader: csv
  path: train.csv
  columns: {user: user, item: item, label: click}
"""
TRAIN = ["user,item,ts,label", "u1,a,10,1", "u1,b,20,0", "u1,c,30,1", "u1,d,30,1", "u2,a,5,0", "u1,e,40,0"]
HELD_OUT = ["u1,x,30,{}", "u1,y,35,{}", "u2,z,9,{}", "u3,a,50,{}"]  # (user, item, ts, label)


def _batch(root: Path, labels: str) -> dict[str, list[list[int]]]:
    """Per history, the ids of each held-out row, the state learned from TRAIN; `labels` one per row."""
    root.mkdir(exist_ok=True)
    (root / "spec.yaml").write_text(SPEC)
    (root / "train.csv").write_text("\n".join(TRAIN) + "\n")
    rows = [line.format(label) for line, label in zip(HELD_OUT, labels, strict=True)]
    (root / "test.csv").write_text("\n".join([TRAIN[0], *rows]) + "\n")
    inputs = model_inputs(validate(load(str(root / "spec.yaml"))))
    learned = learn_features(open_reader(inputs, DataChoice("csv", str(root / "train.csv"))), progress=False)
    inputs = dataclasses.replace(inputs, learned=learned)
    reader = open_reader(inputs, DataChoice("csv", str(root / "test.csv")))
    (local,) = epoch_batches(reader, global_batch=4, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=0)
    value_of = {row: value for value, row in learned.get("item").state.rows.items()}  # the item vocabulary
    out = {}
    for name in ("seen", "liked"):
        ids, lengths = local.batch.sparse[name].values().tolist(), local.batch.sparse[name].lengths().tolist()
        rows_of = [ids[sum(lengths[:i]) : sum(lengths[: i + 1])] for i in range(len(lengths))]
        out[name] = [[value_of[i] for i in row] for row in rows_of]
    return out


def test_liked_history_keeps_the_earlier_training_rows_whose_label_is_one(tmp_path: Path) -> None:
    got = _batch(tmp_path, "0101")
    # u1 at 30: rows before 30 (ties excluded); at 35: the two rows at 30 too (file order among ties)
    assert got["seen"] == [["a", "b"], ["b", "c", "d"], ["a"], []]  # max_length 3: the latest three
    assert got["liked"] == [["a"], ["a", "c", "d"], [], []]


def test_a_held_out_rows_label_changes_no_history(tmp_path: Path) -> None:
    assert _batch(tmp_path / "a", "0000") == _batch(tmp_path / "b", "1111") == _batch(tmp_path / "c", "1010")
