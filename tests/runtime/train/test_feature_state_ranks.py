"""Two ranks apply the same learned features: rank 0 learns them from the training CSV, rank 1 receives them.

Rank 1 is handed a data path that does not exist, so the only way it can hold the state is rank 0's
broadcast (runtime/train/feature_state.py); both states must be byte-identical to one process's
learning, and only rank 0 writes `<module>.features.json`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.multiprocessing as mp

import feature_state_cases as cases
import rendezvous
from compiler.lowering.instantiate import model_inputs
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.learn import learn_features

REPO = Path(__file__).resolve().parents[3]
SPEC = REPO / "specs" / "examples" / "movielens_csv.yaml"
sys.path.insert(0, str(REPO / "tests" / "runtime" / "features"))
from own_data import rating_rows, write_csv  # noqa: E402


def test_every_rank_applies_the_state_rank_0_learned(tmp_path: Path) -> None:
    data = write_csv(tmp_path / "train.csv", rating_rows(users=10, per_user=10))
    with rendezvous.hosted_store() as port:
        mp.spawn(cases.resolve, args=(port, str(SPEC), str(data), str(tmp_path)), nprocs=2)
    inputs = model_inputs(validate(load(str(SPEC))))
    alone = learn_features(open_reader(inputs, DataChoice("csv", str(data)))).to_bytes()
    assert (tmp_path / "rank0.json").read_bytes() == (tmp_path / "rank1.json").read_bytes() == alone
    assert (tmp_path / "rank0" / "model.features.json").read_bytes() == alone
    assert not (tmp_path / "rank1" / "model.features.json").exists()
