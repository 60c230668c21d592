"""runtime/train/checkpointing.py and runtime/checkpoint/: nothing a run saved is lost or misread.

A save after the last step without --checkpoint-every; a damaged newest
checkpoint passed over for the newest intact one; a checkpoint moved to
another step's name refused; another batch size refused on resume; one
writer per checkpoint directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import checkpoint_cases as cc
from runtime.checkpoint.files import CheckpointError
from runtime.checkpoint.store import load_model_state
from runtime.storage.manifest import file_sha256
from runtime.train import worker
from runtime.train.options import TrainOptions

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cc.compile_modules(tmp_path_factory.mktemp("modules"), (1,))[1]


def run_worker(module: Path, **options: object) -> int:
    return worker.run(TrainOptions(module=str(module), **{"steps": 4, "log_every": 1, **options}))


def losses(out: str) -> dict[int, str]:
    return {int(step): loss for step, loss in re.findall(r"^step +(\d+)/\d+ +loss (\S+)", out, re.M)}


def test_a_checkpoint_dir_alone_saves_after_the_last_step(module: Path, tmp_path: Path) -> None:
    assert run_worker(module, checkpoint_dir=tmp_path / "ck") == 0
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [".lock", "step_00000004"]


def test_resume_passes_over_a_damaged_checkpoint_for_the_newest_intact_one(
    module: Path, tmp_path: Path, capsys
) -> None:
    assert run_worker(module, steps=6, batch_size=64) == 0
    reference = losses(capsys.readouterr().out)
    ck = tmp_path / "ck"
    assert run_worker(module, checkpoint_dir=ck, checkpoint_every=2, batch_size=64) == 0
    data = ck / "step_00000004" / "__0_0.distcp"
    damaged = bytearray(data.read_bytes())
    damaged[100] ^= 0xFF
    data.write_bytes(bytes(damaged))
    capsys.readouterr()
    assert run_worker(module, checkpoint_dir=ck, resume=True, steps=6, batch_size=64) == 0
    out, err = capsys.readouterr()
    listed = json.loads((data.parent / "manifest.json").read_text())["files"][data.name]["sha256"]
    assert err == (
        f"warning: passed over a damaged checkpoint: {data}: sha256 {file_sha256(data)[:12]}… does not match "
        f"manifest.json ({listed[:12]}…); the file was changed or corrupted\n"
    )
    assert f"resumed from {ck}/step_00000002 at step 2 (--resume)\n" in out
    assert losses(out) == {step: reference[step] for step in (3, 4, 5, 6)}


def test_a_damaged_checkpoint_the_run_moves_past_takes_no_place_of_keep(module: Path, tmp_path: Path, capsys) -> None:
    """Steps 2, 4 and 6 saved, 6 damaged; resumed from 4, saving every 4 steps with --keep 2: at step 8
    the intact 4 stays beside it, and the damaged 6 is left, uncounted."""
    ck = tmp_path / "ck"
    assert run_worker(module, checkpoint_dir=ck, checkpoint_every=2, steps=6, batch_size=64) == 0
    data = ck / "step_00000006" / "__0_0.distcp"
    damaged = bytearray(data.read_bytes())
    damaged[100] ^= 0xFF
    data.write_bytes(bytes(damaged))
    assert run_worker(module, checkpoint_dir=ck, checkpoint_every=4, keep=2, resume=True, steps=8, batch_size=64) == 0
    assert sorted(p.name for p in ck.iterdir()) == [".lock", "step_00000004", "step_00000006", "step_00000008"]
    assert f"resumed from {ck}/step_00000004 at step 4 (--resume)\n" in capsys.readouterr().out


def test_a_checkpoint_under_another_steps_name_is_refused(module: Path, tmp_path: Path, capsys) -> None:
    ck = tmp_path / "ck"
    assert run_worker(module, checkpoint_dir=ck) == 0
    moved = ck / "step_00000009"
    os.rename(ck / "step_00000004", moved)
    with pytest.raises(CheckpointError) as error:
        load_model_state(moved)
    message = (
        f"{moved}/manifest.json: says step 4 but the directory is named for step 9: the checkpoint was moved or edited"
    )
    assert str(error.value) == message
    capsys.readouterr()
    assert run_worker(module, checkpoint_dir=ck, resume=True, steps=12) == 1
    assert capsys.readouterr().err == f"error: rank 0: no intact checkpoint in {ck}: {message}\n"


def test_resuming_with_another_batch_size_is_refused(module: Path, tmp_path: Path, capsys) -> None:
    ck = tmp_path / "ck"
    assert run_worker(module, checkpoint_dir=ck, batch_size=64) == 0
    capsys.readouterr()
    assert run_worker(module, checkpoint_dir=ck, resume=True, steps=6, batch_size=32) == 1
    assert capsys.readouterr().err == (
        f"error: rank 0: {ck}/step_00000004 was trained with batch size 64, this run's is 32: "
        "resume with --batch-size 64 (the data position is counted in batches)\n"
    )
    assert run_worker(module, checkpoint_dir=ck, resume=True, steps=6, batch_size=64) == 0


def test_a_checkpoint_directory_has_one_writer(module: Path, tmp_path: Path, capsys) -> None:
    ck = tmp_path / "ck"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from runtime.checkpoint.lock import "
            "DirectoryLock; DirectoryLock(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()",
            str(ck),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert run_worker(module, checkpoint_dir=ck) == 1
    finally:
        holder.communicate("")  # the holder exits: the kernel drops its lock
    assert capsys.readouterr().err == (
        f"error: rank 0: {ck} is in use by another training job (pid {holder.pid}, lock {ck}/.lock); "
        "wait for it to end or choose another --checkpoint-dir\n"
    )
    assert not (ck / "step_00000004").exists()
    assert run_worker(module, checkpoint_dir=ck) == 0  # released: the next job writes


def test_resuming_at_the_last_step_says_nothing_is_left_to_train(module: Path, tmp_path: Path, capsys) -> None:
    ck = tmp_path / "ck"
    assert run_worker(module, checkpoint_dir=ck) == 0
    capsys.readouterr()
    assert run_worker(module, checkpoint_dir=ck, resume=True) == 0
    out = capsys.readouterr().out
    assert f"resumed from {ck}/step_00000004 at step 4 (--resume)\n" in out
    assert "note: step 4 is this run's last: nothing is left to train (raise --steps to go on)\n" in out
    assert losses(out) == {}


def test_a_metrics_window_cut_by_a_resume_is_named_with_its_steps(module: Path, tmp_path: Path, capsys) -> None:
    """The window before the checkpoint was not saved: the first log after a resume covers fewer steps."""
    ck = tmp_path / "ck"
    assert run_worker(module, checkpoint_dir=ck, checkpoint_every=1, log_every=2, log_dir=tmp_path / "a") == 0
    whole = capsys.readouterr().out
    shutil.rmtree(ck / "step_00000004")
    assert run_worker(module, checkpoint_dir=ck, resume=True, log_every=2, log_dir=tmp_path / "b") == 0
    resumed = capsys.readouterr().out
    assert losses(resumed) == {4: losses(whole)[4]}
    (line,) = [x for x in resumed.splitlines() if x.startswith("step     4/4")]
    assert line.endswith("  (metrics of steps 4-4)")
    assert not any("metrics of steps" in x for x in whole.splitlines())
    records = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("metrics_steps") for r in records if r["kind"] == "train"] == [[4, 4]]
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("metrics_steps") for r in records if r["kind"] == "train"] == [None, None]
