"""`reccompile data prepare` and `train --data prepared:DIR`: killed and resumed, exact at 1 and 2 ranks."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_model_state, read_checkpoint_manifest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime" / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime" / "checkpoint"))
import checkpoint_cases as cc  # noqa: E402
from sample_files import criteo_line, write_lines  # noqa: E402
from test_data_commands import SPEC  # noqa: E402
from test_train_signals import wait_gone  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def _reccompile(*args: str, **popen: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "compiler.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        **popen,
    )


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=600)
    return process.returncode, out, err


def _step_losses(stdout: str) -> dict[int, float]:
    steps = [line.split() for line in stdout.splitlines() if line.startswith("step ")]
    return {int(words[1].split("/")[0]): float(words[3]) for words in steps}


def _kill_after_its_first_part(process: subprocess.Popen, out: Path) -> None:
    """SIGKILL a running prepare into `out` once its journal lists a part."""
    journal = out / ".prepare.json"
    deadline = time.monotonic() + 300
    while not (journal.is_file() and json.loads(journal.read_text())["parts"]):
        assert process.poll() is None, "the prepare ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("criteo")
    rng = random.Random(5)
    lines = [criteo_line(rng) for _ in range(1500)]
    lines[40] = "2\tbad"
    spec = root / "tiny.yaml"
    spec.write_text(SPEC)
    return spec, write_lines(root / "day_0.gz", lines, gzipped=True)


def test_a_killed_prepare_is_not_data_and_continues_to_the_same_files(tmp_path: Path, files) -> None:
    spec, _ = files
    block = [criteo_line(random.Random(1)) for _ in range(3000)]
    raw = write_lines(tmp_path / "big.tsv", block * 12)  # 36,000 lines
    out = tmp_path / "out"
    args = (
        "data",
        "prepare",
        str(spec),
        "--data",
        f"criteo:{raw}",
        "--row-group-rows",
        "500",
        "--part-row-groups",
        "2",
        "--workers",
        "0",
    )
    process = _reccompile(*args, "-o", str(out))
    _kill_after_its_first_part(process, out)
    assert not (out / "manifest.json").exists()
    assert main(["check", str(spec), "--data", f"prepared:{out}"]) == 1

    code, stdout, stderr = _finish(_reccompile(*args, "-o", str(out)))
    assert code == 0, stderr
    kept = stdout.splitlines()[0]
    assert kept.startswith("resuming a stopped prepare: ") and " parts (" in kept and "0 parts" not in kept, stdout
    code, _, stderr = _finish(_reccompile(*args, "-o", str(tmp_path / "whole")))
    assert code == 0, stderr
    resumed = json.loads((out / "manifest.json").read_text())
    whole = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert resumed["rows"] == whole["rows"] == 36000
    assert [f["sha256"] for f in resumed["files"]] == [f["sha256"] for f in whole["files"]]
    assert resumed["columns"] == whole["columns"]


def test_a_prepare_killed_while_parsing_one_process_per_file_continues_to_the_bytes_of_one_process(
    tmp_path: Path, files
) -> None:
    spec, _ = files
    block = [criteo_line(random.Random(2)) for _ in range(3000)]
    days = tmp_path / "days"
    for day in range(4):
        write_lines(days / f"day_{day}", block * 4)  # 12,000 lines each
    out = tmp_path / "out"
    args = (
        "data",
        "prepare",
        str(spec),
        "--data",
        f"criteo:{days}",
        "--row-group-rows",
        "500",
        "--part-row-groups",
        "2",
    )
    process = _reccompile(*args, "--workers", "2", "-o", str(out))
    _kill_after_its_first_part(process, out)
    assert not (out / "manifest.json").exists()

    code, stdout, stderr = _finish(_reccompile(*args, "--workers", "2", "-o", str(out)))
    assert code == 0, stderr
    kept = stdout.splitlines()[0]
    assert kept.startswith("resuming a stopped prepare: ") and " of the data" in kept and "0 parts" not in kept, stdout
    code, _, stderr = _finish(_reccompile(*args, "--workers", "0", "-o", str(tmp_path / "whole")))
    assert code == 0, stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "whole").iterdir())
    for name in names:
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert json.loads((out / "manifest.json").read_text())["rows"] == 48000


def test_prepare_says_how_many_processes_parse_and_why(tmp_path: Path, files, monkeypatch, capsys) -> None:
    import runtime.data.prepared.parsing as parsing

    spec, _ = files
    rng = random.Random(3)
    for day in range(3):
        write_lines(tmp_path / "days" / f"day_{day}", [criteo_line(rng) for _ in range(40)])
    for cores, said in [
        (2, "line by line in this process (3 files on 2 usable cores: one process per file needs 3 or more)"),
        (4, "with 3 parse processes, one per file (3 files on 4 usable cores: one kept for writing the parts)"),
    ]:
        monkeypatch.setattr(parsing, "usable_cores", lambda: cores)
        out = tmp_path / f"out_{cores}"
        assert main(["data", "prepare", str(spec), "--data", f"criteo:{tmp_path / 'days'}", "-o", str(out)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == f"parsing {said}"
        assert lines[1].startswith(f"prepared 120 rows of 120 lines (0 bad rows dropped) into {out}: ")


def test_prepared_training_equals_the_file_at_one_and_two_ranks_and_resumes_at_the_row(
    tmp_path: Path, files, capsys
) -> None:
    spec, raw = files
    prepared = tmp_path / "prepared"
    assert (
        main(
            [
                "data",
                "prepare",
                str(spec),
                "--data",
                f"criteo:{raw}",
                "-o",
                str(prepared),
                "--row-group-rows",
                "32",
                "--workers",
                "0",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith(f"prepared 1,499 rows of 1,500 lines (1 bad row dropped) into {prepared}")
    assert f"{raw}:41: 2 tab-separated fields" in err
    common = ("--steps", "6", "--batch-size", "128", "--log-every", "1", "--data-workers", "0")

    def train(*args: str) -> dict[int, float]:
        assert main(["train", str(spec), *common, *args]) == 0
        return _step_losses(capsys.readouterr().out)

    from_file = train("--data", f"criteo:{raw}", "--bad-rows", "skip", "-o", str(tmp_path / "a"))
    one = train(
        "--data",
        f"prepared:{prepared}",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--checkpoint-every",
        "3",
        "-o",
        str(tmp_path / "b"),
    )
    assert one == from_file and len(one) == 6
    shutil.rmtree(tmp_path / "ck" / "step_00000006")
    two = _reccompile(
        "train", str(spec), *common, "--data", f"prepared:{prepared}", "--nproc", "2", "-o", str(tmp_path / "c")
    )
    resumed = _reccompile(
        "train",
        str(spec),
        *common,
        "--data",
        f"prepared:{prepared}",
        "--nproc",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--resume",
        "-o",
        str(tmp_path / "d"),
    )
    for process, expected_steps in ((two, range(1, 7)), (resumed, range(4, 7))):
        code, stdout, stderr = _finish(process)
        assert code == 0, stderr
        losses = _step_losses(stdout)
        assert sorted(losses) == list(expected_steps)
        for step, loss in losses.items():
            assert abs(loss - one[step]) <= 1e-5 * abs(one[step]), (losses, one)
    assert f"resumed from {tmp_path / 'ck' / 'step_00000003'} at step 3 (--resume)" in stdout
    assert "skipping the" not in stdout  # started at row 384, not by drawing the batches before it


def test_training_on_data_prepared_for_another_spec_names_the_column(tmp_path: Path, files, capsys) -> None:
    spec, raw = files
    prepared = tmp_path / "prepared"
    assert main(["data", "prepare", str(spec), "--data", f"criteo:{raw}", "-o", str(prepared), "--workers", "0"]) == 0
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("num_embeddings: 1000", "num_embeddings: 5000"))
    capsys.readouterr()
    code = main(["train", str(other), "--steps", "1", "--data", f"prepared:{prepared}", "-o", str(tmp_path / "b")])
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: rank 0: prepared data {prepared}: column 'sparse.cat_0' was prepared with table_rows 1000 but the "
        "spec's sparse feature 'cat_0' has table_rows 5000; prepare the data again for this spec"
    )


def test_the_spec_data_section_names_prepared_data_and_evaluation_reads_it_too(tmp_path: Path, files, capsys) -> None:
    spec, raw = files
    prepared = tmp_path / "prepared"
    assert main(["data", "prepare", str(spec), "--data", f"criteo:{raw}", "-o", str(prepared), "--workers", "0"]) == 0
    section = tmp_path / "section.yaml"
    section.write_text(SPEC + f"data: {{reader: prepared, path: {prepared}}}\n")
    capsys.readouterr()
    code = main(
        [
            "train",
            str(section),
            "--steps",
            "2",
            "--data-workers",
            "0",
            "--eval-data",
            f"prepared:{prepared}",
            "-o",
            str(tmp_path / "b"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["steps"] == 2 and set(summary["eval_metrics"]["click"]) == {"ne", "auc", "accuracy"}


def test_a_killed_torchrun_agent_resumes_from_the_checkpoint_to_the_uninterrupted_state(tmp_path: Path, files) -> None:
    """SIGKILL torchrun's agent (the launcher's child) mid-run: the ranks go with it, the launcher
    says so, and `--resume` ends where one uninterrupted run ends: every loss after the
    checkpoint and the final weights and optimizer state, exactly (the data row it resumed at
    is in the losses: a batch off would change them)."""
    spec, raw = files
    prepared = tmp_path / "prepared"
    assert (
        main(
            [
                "data",
                "prepare",
                str(spec),
                "--data",
                f"criteo:{raw}",
                "-o",
                str(prepared),
                "--row-group-rows",
                "32",
                "--workers",
                "0",
            ]
        )
        == 0
    )
    steps, kill_after = 60, 12  # 11.7 batches an epoch: the run goes on into later epochs after the resume
    common = (
        "train",
        str(spec),
        "--steps",
        str(steps),
        "--batch-size",
        "128",
        "--log-every",
        "1",
        "--nproc",
        "2",
        "--data",
        f"prepared:{prepared}",
        "--shuffle-window",
        "2",
        "--seed",
        "7",
        "--checkpoint-every",
        "5",
    )

    def run(name: str, *args: str) -> subprocess.Popen:
        return _reccompile(
            *common,
            "--checkpoint-dir",
            str(tmp_path / name),
            "--log-dir",
            str(tmp_path / f"{name}_log"),
            "-o",
            str(tmp_path / f"{name}_build"),
            *args,
        )

    killed = run("killed")
    assert killed.stdout is not None
    for line in killed.stdout:
        if line.startswith(f"step {kill_after:>5}/"):
            break
    ranks = list(cc.worker_pids(str(tmp_path / "killed")).values())
    agent = [int(p) for p in Path(f"/proc/{killed.pid}/task/{killed.pid}/children").read_text().split()]
    assert len(agent) == 1
    os.kill(agent[0], signal.SIGKILL)
    code, _, err = _finish(killed)
    assert wait_gone(ranks) == []
    at = read_checkpoint_manifest(tmp_path / "killed")["step"]
    latest = tmp_path / "killed" / f"step_{at:08d}"
    assert code == 1 and 5 <= at < steps, err
    assert err.splitlines()[-1] == (
        f"error: torchrun was killed by signal 9 (SIGKILL), and the ranks with it; the last checkpoint is {latest}: "
        "continue with --resume"
    )
    assert "Traceback" not in err, err
    code, out, err = _finish(run("killed", "--resume"))
    assert code == 0, err
    assert f"resumed from {latest} at step {at} (--resume)" in out
    code, _, err = _finish(run("whole"))
    assert code == 0, err

    def losses(name: str) -> dict[int, float]:
        records = [json.loads(line) for line in (tmp_path / f"{name}_log" / "metrics.jsonl").read_text().splitlines()]
        resumes = [i for i, r in enumerate(records) if r["kind"] == "resume"]
        return {r["step"]: r["loss"] for r in records[(resumes[-1] + 1 if resumes else 0) :] if r["kind"] == "train"}

    whole, resumed = losses("whole"), losses("killed")
    assert sorted(resumed) == list(range(at + 1, steps + 1))
    assert resumed == {step: whole[step] for step in resumed}
    final = {name: load_model_state(tmp_path / name) for name in ("whole", "killed")}
    assert sorted(final["killed"]) == sorted(final["whole"])
    for key, tensor in final["whole"].items():
        assert torch.equal(final["killed"][key], tensor), key


MOVIELENS = """\
version: 1
name: ratings
features:
  sparse:
    - {name: user_id, num_embeddings: 41, dim: 8}
    - {name: movie_id, table: movie}
    - {name: history, table: movie, pooling: none, max_length: 5}
tables:
  - {name: movie, num_embeddings: 61, dim: 8}
model:
  interest: {type: target_attention, input: sparse.history, query: sparse.movie_id, hidden: [8]}
  top: {type: mlp, input: [sparse.user_id, sparse.movie_id, interest], layers: [8, 1]}
heads:
  - {name: like, input: top, loss: bce}
training:
  batch_size: 32
"""


def test_movielens_evaluation_data_maps_ids_and_histories_as_training_does_or_is_refused(
    tmp_path: Path, capsys
) -> None:
    rng = random.Random(3)
    lines = [f"{rng.randrange(1, 41)}::{rng.randrange(1, 61)}::{rng.randrange(1, 6)}::{t}" for t in range(400)]
    train = write_lines(tmp_path / "train" / "ratings.dat", lines[:300])
    test = write_lines(tmp_path / "test" / "ratings.dat", lines[300:])  # its own vocabulary would number otherwise
    flat = tmp_path / "flat.yaml"  # no history
    flat.write_text(
        MOVIELENS.replace("    - {name: history, table: movie, pooling: none, max_length: 5}\n", "")
        .replace(
            "interest: {type: target_attention, input: sparse.history, query: sparse.movie_id, hidden: [8]}",
            "movies: {type: mlp, input: sparse.movie_id, layers: [8]}",
        )
        .replace(", interest]", ", movies]")
    )
    history = tmp_path / "history.yaml"
    history.write_text(MOVIELENS)

    def evaluated(spec: Path, data: str, eval_data: str) -> tuple[int, str, dict]:
        code = main(
            [
                "train",
                str(spec),
                "-o",
                str(tmp_path / spec.stem),
                "--steps",
                "4",
                "--data",
                data,
                "--eval-data",
                eval_data,
                "--data-workers",
                "0",
                "--threads",
                "1",
            ]
        )
        out, err = capsys.readouterr()
        return code, err, json.loads(out.splitlines()[-1]) if code == 0 else {}

    def prepared(spec: Path, data: Path, name: str, *options: str) -> str:
        out = tmp_path / name
        assert (
            main(
                [
                    "data",
                    "prepare",
                    str(spec),
                    "--data",
                    f"movielens:{data}",
                    "-o",
                    str(out),
                    "--workers",
                    "0",
                    "--row-group-rows",
                    "8",
                    *options,
                ]
            )
            == 0
        )
        capsys.readouterr()
        return f"prepared:{out}"

    for spec in (flat, history):
        code, _, reference = evaluated(spec, f"movielens:{train}", f"movielens:{test}")
        assert code == 0
        train_prepared = prepared(spec, train, f"{spec.stem}_train")
        test_prepared = prepared(spec, test, f"{spec.stem}_test", "--training", f"movielens:{train}")
        _, _, got = evaluated(spec, train_prepared, test_prepared)
        assert got["eval_metrics"] == reference["eval_metrics"] and got["loss_last"] == reference["loss_last"]
        code, err, got = evaluated(spec, train_prepared, f"movielens:{test}")
        if spec is flat:  # the prepared data's vocabulary maps the raw evaluation file
            assert got["eval_metrics"] == reference["eval_metrics"]
        else:
            assert (code, err) == (
                1,
                (
                    f"error: rank 0: --eval-data movielens:{test}: the spec's history starts in the training ratings, "
                    f"which {train_prepared} does not keep; prepare the evaluation data with `reccompile data prepare "
                    f"SPEC --data movielens:{test} --training movielens:<the training ratings>` and pass --eval-data "
                    "prepared:DIR\n"
                ),
            )
    own = prepared(flat, test, "own_vocabulary")
    code, err, _ = evaluated(flat, f"movielens:{train}", own)
    assert code == 1
    assert err.startswith(
        f"error: rank 0: --eval-data {own}: its MovieLens ids were mapped with another vocabulary "
        "than the training data's ("
    )
    assert err.endswith(" movies on other rows); prepare it again with --training movielens:<the training ratings>\n")


def test_a_prepare_run_again_on_a_changed_input_is_refused_naming_the_file(tmp_path: Path, capsys) -> None:
    lines = [criteo_line(random.Random(4)) for _ in range(300)]
    lines[9] = "1\tbad"
    raw = write_lines(tmp_path / "day_0.tsv", lines)
    os.utime(raw, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    spec, out = tmp_path / "tiny.yaml", tmp_path / "prepared"
    spec.write_text(SPEC)
    args = ["data", "prepare", str(spec), "--data", f"criteo:{raw}", "-o", str(out), "--workers", "0"]
    assert main(args) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "parsing line by line in this process (--workers 0)"
    assert said[1].startswith(
        f"prepared 299 rows of 300 lines (1 bad row dropped) into {out}: 1 file, 1 row group of up to 512 rows; "
    )
    assert main(args) == 0
    assert capsys.readouterr().out == f"{out}: already prepared (299 rows); nothing to do\n"
    manifest = (out / "manifest.json").read_bytes()
    write_lines(raw, lines[:200])
    os.utime(raw, ns=(1_700_000_100_000_000_000, 1_700_000_100_000_000_000))
    assert main(args) == 1
    out_text, err = capsys.readouterr()
    assert (out_text, err) == (
        "",
        (
            f"error: {out}: already holds prepared data, but {raw} has changed since (then {raw_bytes(lines):,} bytes, "
            f"modified 2023-11-14 22:13:20 UTC; now {raw_bytes(lines[:200]):,} bytes, modified 2023-11-14 22:15:00 "
            f"UTC); choose another -o, or remove {out} to prepare it again\n"
        ),
    )
    assert (out / "manifest.json").read_bytes() == manifest


def raw_bytes(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)
