"""`reccompile train --data criteo:FILE` and `reccompile check --data` on files in the real format."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime" / "data"))
from sample_files import criteo_line, criteo_lines, write_lines  # noqa: E402

REPO = Path(__file__).resolve().parents[3]

SPEC = """\
version: 1
name: tiny_criteo
features:
  dense:
    - {name: int, size: 13}
  sparse:
    - {name: cat, count: 26, num_embeddings: 1000, dim: 8}
model:
  bottom: {type: mlp, input: dense.int, layers: [16, 8]}
  interaction: {type: dot, input: [bottom, sparse.*]}
  top: {type: mlp, input: [bottom, interaction], layers: [16, 1]}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 128
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
"""


@pytest.fixture
def criteo(tmp_path: Path) -> tuple[Path, Path, Path]:
    rng = random.Random(11)
    train = write_lines(tmp_path / "train.gz", [criteo_line(rng) for _ in range(3000)], gzipped=True)
    held_out = write_lines(tmp_path / "eval.txt", [criteo_line(rng) for _ in range(500)], crlf=True)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    return spec, train, held_out


def _train(capsys, spec: Path, *options: str) -> tuple[int, list[str], str]:
    code = main(["train", str(spec), "-o", str(spec.parent / "build"), "--data-workers", "0", *options])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_training_on_a_criteo_file_lowers_the_loss(criteo, capsys) -> None:
    spec, train, held_out = criteo
    logs = spec.parent / "logs"
    code, lines, err = _train(
        capsys,
        spec,
        "--data",
        f"criteo:{train}",
        "--steps",
        "60",
        "--log-every",
        "20",
        "--eval-data",
        f"criteo:{held_out}",
        "--eval-every",
        "30",
        "--log-dir",
        str(logs),
    )
    assert code == 0, err
    assert lines[0].startswith("training tiny_criteo on 1 rank: ")
    assert [line.split()[:2] for line in lines[1:-1]] == [
        ["step", "20/60"],
        ["eval", "30/60"],
        ["step", "40/60"],
        ["step", "60/60"],
        ["eval", "60/60"],
    ]
    final = json.loads(lines[-1])
    keys = {"steps", "samples_per_s", "loss_first", "loss_last", "metrics", "eval_metrics", "bad_rows"}
    assert keys <= set(final)
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.9 * final["loss_first"], (final, losses)
    assert final["eval_metrics"]["click"]["auc"] > 0.75 and final["eval_metrics"]["click"]["ne"] < 1.0
    assert final["bad_rows"] == 0 and (logs / "metrics.png").is_file()


def test_a_bad_row_stops_training_or_is_skipped_and_summarised(tmp_path: Path, capsys) -> None:
    rng = random.Random(2)
    lines = [criteo_line(rng) for _ in range(300)]
    lines[41] = lines[41].replace("\t", "\t\t", 1)
    data = write_lines(tmp_path / "day_0", lines)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    code, _, err = _train(capsys, spec, "--data", f"criteo:{data}", "--steps", "2")
    assert code == 1
    assert err.strip() == (
        f"error: rank 0: {data}:42: 41 tab-separated fields, expected 40 (label, I1..I13, C1..C26) "
        f"(value {lines[41][:40] + '...'!r}); pass --bad-rows skip to count and skip bad rows instead"
    )
    code, out, err = _train(capsys, spec, "--data", f"criteo:{data}", "--steps", "2", "--bad-rows", "skip")
    assert code == 0 and json.loads(out[-1])["bad_rows"] == 1
    assert f"warning: skipped bad row {data}:42: 41 tab-separated fields" in err
    assert "training data: skipped 1 bad row of 300 read; the first:" in err


def _three_bad_rows(tmp_path: Path) -> tuple[Path, Path]:
    """300 Criteo lines, 3 of them bad (297 good rows: 2.3 batches of 128), and the spec."""
    lines = criteo_lines(300, seed=6)
    for index in (10, 150, 290):
        lines[index] = "1\tbad"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    return spec, write_lines(tmp_path / "day_0", lines)


def test_bad_rows_are_counted_once_and_each_new_pass_over_the_data_is_said(tmp_path: Path, capsys) -> None:
    spec, data = _three_bad_rows(tmp_path)
    code, out, err = _train(capsys, spec, "--data", f"criteo:{data}", "--steps", "5", "--bad-rows", "skip")
    assert code == 0, err
    assert json.loads(out[-1])["bad_rows"] == 3
    # pass 1 ends at good row 297, in step 3 (rows 257..384); pass 2 at row 594, in step 5
    said = [line for line in err.splitlines() if not line.startswith(("warning: ", "  "))]
    assert said == [
        f"training data criteo:{data}: read to its end at step 3; starting again from its beginning (pass 2)",
        f"training data criteo:{data}: read to its end at step 5; starting again from its beginning (pass 3)",
        "training data: skipped 3 bad rows of the data's 300, counted once though it was read more than once; "
        "the first:",
    ]
    assert err.count("warning: skipped bad row") == 3
    code, out, err = _train(capsys, spec, "--data", f"criteo:{data}", "--steps", "2", "--bad-rows", "skip")
    assert code == 0 and "starting again" not in err  # step 2 ends within the first pass


def test_two_ranks_say_a_new_pass_once(tmp_path: Path) -> None:
    spec, data = _three_bad_rows(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compiler.cli",
            "train",
            str(spec),
            "-o",
            str(tmp_path / "build"),
            "--nproc",
            "2",
            "--data",
            f"criteo:{data}",
            "--steps",
            "3",
            "--bad-rows",
            "skip",
            "--data-workers",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["bad_rows"] == 3
    said = f"training data criteo:{data}: read to its end at step 3; starting again from its beginning (pass 2)"
    assert done.stderr.splitlines().count(said) == 1, done.stderr


def test_the_spec_data_section_selects_the_reader(criteo, capsys) -> None:
    spec, train, _ = criteo
    spec.write_text(SPEC + f"data:\n  reader: criteo\n  path: {train}\n  columns: {{C1: cat_1, C2: cat_0}}\n")
    code, lines, err = _train(capsys, spec, "--steps", "2", "--log-every", "1")
    assert code == 0, err
    assert json.loads(lines[-1])["bad_rows"] == 0


def test_check_reports_bad_rows_with_file_and_line(criteo, capsys) -> None:
    spec, train, held_out = criteo
    lines = held_out.read_text().splitlines()
    lines[2] = lines[2].replace("\t", "\t1.5", 1)
    write_lines(held_out, lines)
    assert main(["check", str(spec), "--data", f"criteo:{train}", "--sample", "100"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[:2] == [
        f"{spec}: ok",
        f"{train}: criteo data, first 100 lines checked: 100 good, 0 bad; "
        f"lines from {train}:101 on were not parsed (--sample N checks more)",
    ]
    assert out.splitlines()[2].startswith("  label click: 0: ") and err == ""
    assert main(["check", str(spec), "--data", f"criteo:{held_out}"]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"{held_out}:3: error: column I1: not an integer of at most 18 digits (value {lines[2].split(chr(9))[1]!r})",
        "1 error",
    ]


def test_check_without_data_checks_the_files_the_specs_data_section_names(criteo, capsys) -> None:
    """What `train` reads when given no --data."""
    spec, _, held_out = criteo
    lines = held_out.read_text().splitlines()
    lines[4] = lines[4].replace("\t", "\tx", 1)
    write_lines(held_out, lines)
    spec.write_text(SPEC + f"data: {{reader: criteo, path: {held_out}}}\n")
    assert main(["check", str(spec)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[:2] == [f"{spec}: ok", f"{held_out}: criteo data, all 500 lines checked: 499 good, 1 bad"]
    assert err.splitlines() == [
        f"{held_out}:5: error: column I1: not an integer of at most 18 digits (value {lines[4].split(chr(9))[1]!r})",
        "1 error",
    ]


def test_check_reports_a_spec_the_file_cannot_feed(tmp_path: Path, capsys) -> None:
    data = write_lines(tmp_path / "d.txt", [criteo_line(random.Random(0))])
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC.replace("count: 26", "count: 3"))
    assert main(["check", str(spec), "--data", f"criteo:{data}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{data}: error: criteo has 26 categorical columns (C1..C26) but the spec has 3 sparse")


def test_a_truncated_gzip_file_is_one_clean_line_with_or_without_dataloader_workers(criteo, capsys) -> None:
    spec, train, _ = criteo
    whole = train.read_bytes()
    cut = train.with_name("cut.gz")
    cut.write_bytes(whole[: len(whole) // 2])
    reason = "Compressed file ended before the end-of-stream marker was reached"
    for workers in ("0", "1", "2"):
        code = main(
            [
                "train",
                str(spec),
                "-o",
                str(spec.parent / "build"),
                "--data",
                f"criteo:{cut}",
                "--steps",
                "40",
                "--data-workers",
                workers,
            ]
        )
        err = capsys.readouterr().err
        assert code == 1
        assert re.fullmatch(rf"error: rank 0: {re.escape(str(cut))}: cannot read past line \d+: {reason}\n", err), err
    assert main(["check", str(spec), "--data", f"criteo:{cut}", "--sample", "3000"]) == 1
    out, err = capsys.readouterr()
    assert out == f"{spec}: ok\n"
    assert re.fullmatch(rf"error: {re.escape(str(cut))}: cannot read past line \d+: {reason}\n", err), err


MOVIELENS_SPEC = """\
version: 1
name: users_943
features:
  sparse:
    - {name: user_id, num_embeddings: USERS, dim: 8}
    - {name: movie_id, num_embeddings: 101, dim: 8}
model:
  user_tower: {type: mlp, input: sparse.user_id, layers: [8], final_activation: none}
  item_tower: {type: mlp, input: sparse.movie_id, layers: [8], final_activation: none}
  score: {type: dot_product, input: [user_tower, item_tower]}
heads:
  - {name: like, input: score, loss: bce}
training:
  batch_size: 32
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
"""


@pytest.fixture
def users_943(tmp_path: Path) -> Path:
    """ml-100k's u.data layout: 943 users, of whom only the first 500 rate in the first 1,000 lines."""
    early = [f"{i % 500 + 1}\t{i % 100 + 1}\t{i % 5 + 1}\t{881250949 + i}" for i in range(1000)]
    late = [f"{user}\t{user % 100 + 1}\t4\t{891250949 + user}" for user in range(501, 944)]
    return write_lines(tmp_path / "ml-100k" / "u.data", early + late)


@pytest.mark.parametrize("sample", [[], ["--sample", "10"]])
def test_check_builds_the_movielens_vocabulary_from_the_whole_file(users_943: Path, capsys, sample: list[str]) -> None:
    spec = users_943.parent.parent / "users.yaml"
    spec.write_text(MOVIELENS_SPEC.replace("USERS", "943"))
    assert main(["check", str(spec), "--data", f"movielens:{users_943}", *sample]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{spec}: ok",
        f"{users_943}: movielens ids, all 1,443 good lines read: 943 distinct userId, 100 distinct movieId",
    ]
    message = "feature 'user_id': 944 rows needed (userId values plus row 0 for unseen ids) but its table has 943"
    assert err.splitlines() == [f"{users_943}: error: {message}", "1 error"]
    code, _, err = _train(capsys, spec, "--data", f"movielens:{users_943}", "--steps", "1")
    assert (code, err) == (1, "error: rank 0: " + message + "\n")  # what check now says before training


def test_check_says_which_lines_it_did_not_parse(users_943: Path, capsys) -> None:
    spec = users_943.parent.parent / "users.yaml"
    spec.write_text(MOVIELENS_SPEC.replace("USERS", "944"))
    assert main(["check", str(spec), "--data", f"movielens:{users_943}"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1:3] == [
        f"{users_943}: movielens ids, all 1,443 good lines read: 943 distinct userId, 100 distinct movieId",
        f"{users_943}: movielens data, first 1,000 lines checked: 1,000 good, 0 bad; "
        f"lines from {users_943}:1001 on were not parsed (--sample N checks more)",
    ]
    assert err == ""
    assert main(["check", str(spec), "--data", f"movielens:{users_943}", "--sample", "1443"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == f"{users_943}: movielens data, all 1,443 lines checked: 1,443 good, 0 bad"
    assert out[4] == "  feature user_id: 943 distinct rows of 944 (max row 943), 1 ids per row"


BAGS_SPEC = """\
version: 1
name: bags
features:
  dense:
    - {name: x, size: 1}
  sparse:
    - {name: tags, num_embeddings: 64, dim: 8, max_ids_per_sample: 3, position_weights: true}
model:
  top: {type: mlp, input: [dense.x, sparse.tags], layers: [8, 1]}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 8
data: {reader: csv, path: DATA, columns: {a: x, tags: tags, clicked: click}}
"""


def test_a_bag_longer_than_max_ids_per_sample_is_a_bad_row_everywhere(tmp_path: Path, capsys) -> None:
    rows = [f"0.{i},{i}|{i + 1},{i % 2}" for i in range(40)]
    rows[3] = "0.5,1|2|3|4|5|6,1"  # line 5, after the header
    data = write_lines(tmp_path / "long.csv", ["a,tags,clicked", *rows])
    spec = tmp_path / "bags.yaml"
    spec.write_text(BAGS_SPEC.replace("DATA", str(data)))
    why = f"{data}:5: column tags: 6 ids, but feature 'tags' takes at most 3 (max_ids_per_sample) (value '1|2|3|4|5|6')"
    assert main(["check", str(spec), "--data", f"csv:{data}"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[1] == f"{data}: csv data, all 40 lines checked: 39 good, 1 bad"
    assert err.splitlines() == [
        f"{data}:5: error: column tags: 6 ids, but feature 'tags' takes at most 3 "
        "(max_ids_per_sample) (value '1|2|3|4|5|6')",
        "1 error",
    ]
    code, _, err = _train(capsys, spec, "--steps", "2")
    assert (code, err) == (1, f"error: rank 0: {why}; pass --bad-rows skip to count and skip bad rows instead\n")
    code, out, err = _train(capsys, spec, "--steps", "2", "--bad-rows", "skip")
    assert code == 0 and json.loads(out[-1])["bad_rows"] == 1
    assert f"warning: skipped bad row {why}" in err
