"""Features learned once from a user's own CSV: learned from the training rows only, and applied the same
by training, evaluation, prepared data, Parquet, `predict` and a resumed run.

One module fixture writes a small ratings table in the layout of specs/examples/movielens_csv.yaml
(tests/runtime/features/own_data.py), trains the example 30 steps with --eval-data, exports it, predicts
the test CSV and prepares both files; the tests compare what each path made of the same rows.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from own_data import HEADER, rating_rows, split_by_user, write_csv

from compiler.cli import main
from compiler.lowering.instantiate import model_inputs
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.errors import DataError
from runtime.data.files.arrow import pa, pq
from runtime.data.loader import epoch_batches
from runtime.data.prepared.batches import prepared_epoch_batches
from runtime.data.prepared.reading import open_prepared
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.learn import with_learned
from runtime.features.hashing import hash_text
from runtime.serving.samples import open_samples

SPEC = Path(__file__).resolve().parents[3] / "specs" / "examples" / "movielens_csv.yaml"


def _run(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("own_data")
    train, test = split_by_user(rating_rows())
    write_csv(root / "train.csv", train)
    write_csv(root / "test.csv", test)
    # One thread in every run compared bit for bit: the default follows the cores free at launch, and two
    # threads sum the GEMMs in another order than one.
    common = ["--data-workers", "0", "--threads", "1", "-o", str(root / "build")]
    trained = _run(
        "train",
        str(SPEC),
        "--data",
        f"csv:{root}/train.csv",
        "--eval-data",
        f"csv:{root}/test.csv",
        "--steps",
        "30",
        "--checkpoint-dir",
        str(root / "ckpt"),
        "--checkpoint-every",
        "30",
        *common,
    )
    _run(
        "export",
        str(SPEC),
        "--checkpoint",
        str(root / "ckpt"),
        "--quantize",
        "none",
        "--no-aot",
        "-o",
        str(root / "out"),
    )
    _run("predict", str(root / "out"), "--data", f"csv:{root}/test.csv", "-o", str(root / "pred.csv"))
    _run("data", "prepare", str(SPEC), "--data", f"csv:{root}/train.csv", "-o", str(root / "prep_train"))
    _run(
        "data",
        "prepare",
        str(SPEC),
        "--data",
        f"csv:{root}/test.csv",
        "--training",
        f"{root}/train.csv",
        "-o",
        str(root / "prep_test"),
    )
    inputs = model_inputs(validate(load(str(SPEC))))
    return {
        "root": root,
        "train": train,
        "test": test,
        "result": json.loads(trained.strip().splitlines()[-1]),
        "inputs": inputs,
    }


def _auc(scores: list[float], labels: list[float]) -> float:
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def test_the_state_is_learned_from_the_training_rows_only(run: dict) -> None:
    state = json.loads((run["root"] / "out" / "features.json").read_text())["features"]
    users = Counter(row[0] for row in run["train"])
    assert state["user"]["state"]["values"] == sorted(users, key=lambda u: (-users[u], u))
    years = [float(row[7]) for row in run["train"] if row[7]]
    assert state["year"]["state"]["fill"] == [pytest.approx(sum(years) / len(years), rel=1e-12)]
    ages = [float(row[3]) for row in run["train"]]
    mean = sum(ages) / len(ages)
    assert state["age"]["state"]["mean"] == [pytest.approx(mean, rel=1e-12)]
    assert state["age"]["state"]["std"] == [pytest.approx(math.sqrt(sum((a - mean) ** 2 for a in ages) / len(ages)))]
    zips = Counter(row[6] for row in run["train"])
    assert state["zip"]["state"]["values"] == sorted((z for z in zips if zips[z] >= 2), key=lambda z: (-zips[z], z))
    history = state["seen"]["state"]["keys"]["u0"]
    user0 = sorted((row for row in run["train"] if row[0] == "u0"), key=lambda row: int(row[8]))
    assert history == [[float(row[8]) for row in user0], [row[1] for row in user0]]
    assert (run["root"] / "prep_train" / "features.json").read_bytes() == (
        run["root"] / "out" / "features.json"
    ).read_bytes()


def test_the_same_rows_give_the_same_ids_and_numbers_on_every_path(run: dict) -> None:
    root, inputs = run["root"], run["inputs"]
    learned = with_learned(inputs, root / "out" / "features.json")
    shape = dict(global_batch=1000, rank=0, world_size=1)

    def batch_of(reader) -> object:
        (local,) = epoch_batches(reader, bad_rows=BadRowLog("fail"), num_workers=0, **shape)
        return local.batch

    direct = batch_of(open_reader(learned, DataChoice("csv", str(root / "test.csv"))))
    (prepared,) = prepared_epoch_batches(open_prepared(inputs, root / "prep_test"), num_workers=0, **shape)
    samples = open_samples(inputs, f"csv:{root}/test.csv", batch_size=1000, features=root / "out" / "features.json")
    ((_, predicted),) = list(samples.batches)
    table = pa.Table.from_pylist([dict(zip(HEADER.split(","), row)) for row in run["test"]])
    pq.write_table(table, root / "test.parquet")
    parquet_inputs = with_learned(_reader_section(inputs, "parquet"), root / "out" / "features.json")
    from_parquet = batch_of(open_reader(parquet_inputs, DataChoice("parquet", str(root / "test.parquet"))))
    for other in (prepared.batch, predicted, from_parquet):
        assert other.sparse.keys() == direct.sparse.keys()
        for key in direct.sparse.keys():
            assert torch.equal(other.sparse[key].values(), direct.sparse[key].values()), key
            assert torch.equal(other.sparse[key].lengths(), direct.sparse[key].lengths()), key
        for name in direct.dense:
            assert torch.equal(other.dense[name], direct.dense[name]), name
    # an evaluation row's history: the user's training movies strictly before it in time, the last 50
    state = learned.learned
    movie_rows = state.get("movie").state.rows
    first = run["test"][0]
    earlier = [
        row[1]
        for row in sorted(run["train"], key=lambda row: int(row[8]))
        if row[0] == first[0] and int(row[8]) < int(first[8])
    ][-50:]
    seen = direct.sparse["seen"]
    assert seen.values()[: seen.lengths()[0]].tolist() == [movie_rows.get(m, 0) for m in earlier]
    # its liked history: of those training rows, the ones labelled 1 (the test row's own label is never read)
    liked_earlier = [
        row[1]
        for row in sorted(run["train"], key=lambda row: int(row[8]))
        if row[0] == first[0] and int(row[8]) < int(first[8]) and row[9] == "1"
    ][-50:]
    liked = direct.sparse["liked"]
    assert liked.values()[: liked.lengths()[0]].tolist() == [movie_rows.get(m, 0) for m in liked_earlier]
    assert 0 < liked.lengths()[0] < seen.lengths()[0]
    cross = direct.sparse["gender_occupation"].values()[0]
    assert int(cross) == hash_text(f"{first[4]}\x1f{first[5]}") % 256
    # its like rate: the mean label of those training rows (last 10 of them too), standardized as learned on
    # the training rows' own rates; the same on every path above
    labels = [
        float(row[9])
        for row in sorted(run["train"], key=lambda row: int(row[8]))
        if row[0] == first[0] and int(row[8]) < int(first[8])
    ]
    for name, rates in (("user_rate", labels), ("user_rate_10", labels[-10:])):
        aggregate = state.get(name).state
        expected = (sum(rates) / len(rates) - aggregate.numeric["mean"][0]) / aggregate.numeric["std"][0]
        assert float(direct.dense[name][0, 0]) == pytest.approx(expected, abs=1e-5), name
    assert {"user_rate_20", "user_rate_50", "user_genre_rate", "movie_count"} <= set(direct.dense)


def test_a_tie_in_time_is_not_history(run: dict) -> None:
    learned = with_learned(run["inputs"], run["root"] / "out" / "features.json")
    user0 = sorted((row for row in run["train"] if row[0] == "u0"), key=lambda row: int(row[8]))
    tied = [row for row in user0 if sum(int(r[8]) == int(row[8]) for r in user0) == 2]
    assert len(tied) == 2  # own_data gives every user one pair of ratings in the same minute
    history = learned.learned.get("seen").state
    before = history.before("u0", float(tied[0][8]), 50)
    assert tied[0][1] not in before and tied[1][1] not in before
    assert len(before) == user0.index(tied[0])


def test_predict_and_prepared_data_reproduce_the_evaluation(run: dict) -> None:
    root = run["root"]
    with open(root / "pred.csv") as stream:
        scores = [float(row["like"]) for row in csv.DictReader(stream)]
    labels = [float(row[9]) for row in run["test"]]
    assert _auc(scores, labels) == pytest.approx(run["result"]["eval_metrics"]["like"]["auc"], abs=1e-6)
    assert run["result"]["eval_unseen_ids"] == {
        "user": 0,
        "movie": 0,
        "genres": 0,
        "gender": 0,
        "occupation": 0,
        "zip": 0,
    }
    prepared = _run(
        "train",
        str(SPEC),
        "--data",
        f"prepared:{root}/prep_train",
        "--eval-data",
        f"prepared:{root}/prep_test",
        "--steps",
        "30",
        "--data-workers",
        "0",
        "--threads",
        "1",
        "-o",
        str(root / "build_p"),
    )
    result = json.loads(prepared.strip().splitlines()[-1])
    assert result["eval_metrics"] == run["result"]["eval_metrics"]
    assert result["loss_last"] == run["result"]["loss_last"]


def test_rows_to_score_need_no_label_and_any_label_is_ignored(run: dict) -> None:
    """Requests have no label: `predict` on the test rows without their label column, or with labels
    no head takes (7, "x"), scores exactly as on the labelled file; a Parquet file of requests
    without the column reads the same features, its labels 0."""
    root = run["root"]
    with open(root / "pred.csv") as stream:
        labelled = [row["like"] for row in csv.DictReader(stream)]
    header = HEADER.split(",")
    unlabelled = [row[:9] for row in run["test"]]
    odd = [[*row[:9], "x" if i == 0 else "7"] for i, row in enumerate(run["test"])]
    for case, names, rows in (("none", header[:9], unlabelled), ("odd", header, odd)):
        path = root / f"requests_{case}.csv"
        path.write_text("\n".join([",".join(names), *(",".join(row) for row in rows)]) + "\n")
        _run("predict", str(root / "out"), "--data", f"csv:{path}", "-o", str(root / f"pred_{case}.csv"))
        with open(root / f"pred_{case}.csv") as stream:
            assert [row["like"] for row in csv.DictReader(stream)] == labelled, case
    pq.write_table(
        pa.Table.from_pylist([dict(zip(header[:9], row, strict=True)) for row in unlabelled]), root / "requests.parquet"
    )
    learned = with_learned(run["inputs"], root / "out" / "features.json")
    readers = {
        "csv": open_reader(learned, DataChoice("csv", str(root / "test.csv"))),
        "parquet": open_reader(
            _reader_section(learned, "parquet"), DataChoice("parquet", str(root / "requests.parquet")), requests=True
        ),
    }
    (csv_batch, parquet_batch) = (
        next(
            epoch_batches(reader, global_batch=1000, rank=0, world_size=1, bad_rows=BadRowLog("fail"), num_workers=0)
        ).batch
        for reader in readers.values()
    )
    for key in csv_batch.sparse.keys():  # noqa: SIM118 (a KeyedJaggedTensor, no mapping)
        assert torch.equal(parquet_batch.sparse[key].values(), csv_batch.sparse[key].values()), key
    for name in csv_batch.dense:
        assert torch.equal(parquet_batch.dense[name], csv_batch.dense[name]), name
    assert [label.abs().sum().item() for label in parquet_batch.labels.values()] == [0.0]
    with pytest.raises(DataError, match=r"requests\.parquet: no column 'label' \(data\.columns maps it\)$"):
        open_reader(_reader_section(learned, "parquet"), DataChoice("parquet", str(root / "requests.parquet")))


def test_a_resumed_run_keeps_the_checkpoint_state_whatever_it_reads(run: dict) -> None:
    root = run["root"]
    shutil.copytree(root / "ckpt", root / "ckpt_resumed")
    _run(
        "train",
        str(SPEC),
        "--data",
        f"csv:{root}/test.csv",
        "--steps",
        "32",
        "--resume",
        "--checkpoint-dir",
        str(root / "ckpt_resumed"),
        "--data-workers",
        "0",
        "-o",
        str(root / "build_r"),
    )
    saved = (root / "ckpt" / "step_00000030" / "features.json").read_bytes()
    assert (root / "build_r" / "movielens_csv.features.json").read_bytes() == saved


def test_predict_without_the_learned_state_is_refused(run: dict) -> None:
    samples = open_samples(run["inputs"], f"csv:{run['root']}/test.csv", batch_size=10)
    with pytest.raises(DataError) as error:
        next(iter(samples.batches))
    assert str(error.value) == (
        "features 'age', 'year', 'user_rate', 'user_rate_10', 'user_rate_20', 'user_rate_50', 'user_genre_rate', "
        "'movie_count', 'movie_rate', 'user_count', 'movie_gender_rate', 'movie_occupation_rate', 'user', 'movie', "
        "'seen', 'liked', 'disliked', 'genres', 'gender', 'occupation', 'zip', 'age_bucket', 'year_bucket' "
        "have learned transforms but no learned state: learn them (reccompile data prepare, or train on the raw "
        "files) or read the state saved with them"
    )


def _reader_section(inputs, reader: str):
    import dataclasses

    return dataclasses.replace(inputs, data=dataclasses.replace(inputs.data, reader=reader))


CRITEO_LIKE = """\
version: 1
name: criteo_like
features:
  dense:
    - {name: counts, size: 3, transform: {fill: mean, clip: [0, 1000], log: true, scale: standardize}}
  sparse:
    - {name: site, num_embeddings: auto, dim: 4, vocabulary: {min_count: 2, max_size: 50, oov_buckets: 2}}
    - {name: ad, num_embeddings: 64, dim: 4}
    - {name: site_ad, cross: [site, ad], num_embeddings: 64, dim: 4}
    - {name: count_q, count: 3, column: counts, quantiles: 4, dim: 4}
model:
  deep: {type: mlp, input: [dense.counts, sparse.*], layers: [8, 1], final_activation: none}
heads:
  - {name: click, input: deep, loss: bce}
training:
  batch_size: 64
  dense_optimizer: {type: adagrad, lr: 0.1}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
data:
  reader: csv
  path: clicks.csv
  columns: {label: click, I1: counts, I2: counts, I3: counts, site: site, ad: ad}
"""


def test_a_criteo_like_table_with_string_categoricals_and_missing_numbers_trains(tmp_path: Path) -> None:
    import random

    rng = random.Random(1)
    lines = ["label,I1,I2,I3,site,ad"]
    for i in range(300):
        site = f"s{rng.randint(0, 9)}" if i % 10 else f"rare{i}"  # every 10th row a site seen once
        counts = ["" if rng.random() < 0.2 else str(rng.randint(0, 3000)) for _ in range(3)]
        label = int(rng.random() < (0.8 if site in ("s1", "s3", "s5") else 0.2))
        lines.append(",".join([str(label), *counts, site, f"ad{rng.randint(0, 30)}"]))
    (tmp_path / "clicks.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "spec.yaml").write_text(CRITEO_LIKE)
    out = _run(
        "train",
        str(tmp_path / "spec.yaml"),
        "--data",
        f"csv:{tmp_path}/clicks.csv",
        "--eval-data",
        f"csv:{tmp_path}/clicks.csv",
        "--steps",
        "20",
        "--data-workers",
        "0",
        "-o",
        str(tmp_path / "build"),
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result["eval_unseen_ids"] == {"site": 30}  # the 30 rare sites: below min_count 2, in the OOV rows
    assert result["loss_last"] < result["loss_first"]
    state = json.loads((tmp_path / "build" / "criteo_like.features.json").read_text())["features"]
    present = [float(line.split(",")[1]) for line in lines[1:] if line.split(",")[1]]
    assert state["counts"]["state"]["fill"][0] == pytest.approx(sum(present) / len(present), rel=1e-12)
    assert state["site"]["state"]["values"] == sorted(
        {f"s{i}" for i in range(10)}, key=lambda s: (-sum(line.split(",")[4] == s for line in lines), s)
    )
    assert len(state["count_q_0"]["state"]["boundaries"]) == 3


def test_check_reports_what_is_learned_and_the_collisions_of_hashed_features(run: dict, capsys) -> None:
    assert main(["check", str(SPEC), "--data", f"csv:{run['root']}/train.csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  feature user: vocabulary of 40 values (of 40 seen, min_count 1), 1 OOV row" in out
    assert "  feature seen: history of movie by user: 40 keys, 640 training rows" in out
    assert (
        out[-1] == "  hashed feature gender_occupation: 10 distinct values in 640 rows; 0 (0.0%) share a row of its 256"
    )
