"""runtime/train/kernel_choices.py: a run's kernel choices agreed across ranks, checkpointed, repeated on resume.

The resume tests train the checkpoint tests' tiny spec with a choice cache of
their own (RECCOMPILE_CACHE_DIR), then turn every recorded choice on disk to
the other implementation before resuming: the resumed run must still compute
the uninterrupted run's losses and final weights bit for bit, from the
choices its checkpoint kept, while a fresh run on the changed cache ends
with other weights (its losses may round alike).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import checkpoint_cases as cc
import kernel_choice_cases as kc
import rendezvous
from compiler.cli import main as reccompile
from runtime.cpu import choice
from runtime.checkpoint.store import load_model_state, read_checkpoint_manifest

REPO = Path(__file__).resolve().parents[3]
STEPS = 12
SAVED_AT = 6


def train(spec: Path, directory: Path, ranks: int, *extra: str) -> dict[int, float]:
    """`reccompile train` (in this process for one rank); the losses logged after its last resume."""
    command = [
        "train",
        str(spec),
        "-o",
        str(directory / "build"),
        "--nproc",
        str(ranks),
        "--threads",
        "1",
        "--steps",
        str(STEPS),
        "--batch-size",
        "512",
        "--log-every",
        "1",
        "--log-dir",
        str(directory / "log"),
        *extra,
    ]
    if ranks == 1:
        threads = torch.get_num_threads()
        try:
            assert reccompile(command) == 0
        finally:
            torch.set_num_threads(threads)
    else:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "compiler.cli", *command],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (directory / "log" / "metrics.jsonl").read_text().splitlines()]
    resumes = [i for i, r in enumerate(records) if r["kind"] == "resume"]
    after = records[resumes[-1] + 1 :] if resumes else records
    return {r["step"]: r["loss"] for r in after if r["kind"] == "train"}


def flip_every_recorded_choice(cache: Path) -> int:
    """Each choice file under `cache` made to name the other implementation; how many."""
    files = sorted(choice.directory(cache).glob("*/*.json"))
    for path in files:
        record = json.loads(path.read_text())
        baseline, alternative = choice.KERNELS[record["kernel"]]
        record["winner"] = alternative if record["winner"] == baseline else baseline
        path.write_text(json.dumps(record))
    return len(files)


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_resumed_run_repeats_its_checkpoints_choices_whatever_the_cache_says_by_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native_kernels: None, ranks: int
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(cache))
    monkeypatch.delenv(choice.ENV, raising=False)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(cc.SPEC)
    checkpoints = tmp_path / "checkpoints"
    saving = ("--checkpoint-dir", str(checkpoints), "--checkpoint-every", str(SAVED_AT))
    uninterrupted = train(spec, tmp_path / "uninterrupted", ranks, *saving)
    assert sorted(uninterrupted) == list(range(1, STEPS + 1))

    final = load_model_state(checkpoints / f"step_{STEPS:08d}")
    shutil.rmtree(checkpoints / f"step_{STEPS:08d}")  # resume from the middle of the run
    kept = read_checkpoint_manifest(checkpoints)["kernels"]
    assert {"dot", "embedding_update"} <= set(kept), kept  # the tiny spec's numerics-changing kernels
    assert flip_every_recorded_choice(cache) > 0

    resumed = train(spec, tmp_path / "resumed", ranks, *saving, "--resume")
    assert resumed == {step: uninterrupted[step] for step in range(SAVED_AT + 1, STEPS + 1)}
    assert read_checkpoint_manifest(checkpoints)["kernels"] == kept
    assert _equal(load_model_state(checkpoints), final)
    if ranks == 1:  # the changed cache does change the numerics of a run that does not resume
        # (its losses may round alike: the final weights do not)
        train(spec, tmp_path / "fresh", ranks, "--checkpoint-dir", str(tmp_path / "fresh_ck"))
        assert read_checkpoint_manifest(tmp_path / "fresh_ck")["kernels"] != kept
        assert not _equal(load_model_state(tmp_path / "fresh_ck"), final)


def _equal(state: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    """Whether two model states hold the same tensors, bit for bit."""
    return state.keys() == other.keys() and all(torch.equal(state[key], other[key]) for key in state)


def test_a_resume_where_a_recorded_kernel_is_missing_warns_and_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], native_kernels: None
) -> None:
    from runtime.cpu.native import build

    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(choice.ENV, "embedding_update=native")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(cc.SPEC)
    checkpoints = tmp_path / "checkpoints"
    train(spec, tmp_path / "first", 1, "--checkpoint-dir", str(checkpoints), "--steps", str(SAVED_AT))
    sites = read_checkpoint_manifest(checkpoints)["kernels"]["embedding_update"]
    assert sites and set(sites.values()) == {"native"}, sites
    monkeypatch.delenv(choice.ENV)
    capsys.readouterr()

    monkeypatch.setenv("CC", "no-such-cc")  # another machine: the native kernels do not build there
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path / "other-cache"))
    build.status.cache_clear()
    try:
        train(spec, tmp_path / "resumed", 1, "--checkpoint-dir", str(checkpoints), "--resume")
    finally:
        build.status.cache_clear()
    err = capsys.readouterr().err
    for site in sites:
        assert (
            f"warning: {checkpoints}/step_{SAVED_AT:08d}: kernel embedding_update ran native at {site}, which is "
            "unavailable here (native kernels: no C compiler: 'no-such-cc' is not on PATH (set CC to one)); using "
            "fbgemm, so this run will not repeat the one that recorded it exactly\n"
        ) in err
    assert read_checkpoint_manifest(checkpoints)["kernels"]["embedding_update"] == dict.fromkeys(sites, "fbgemm")


def run_two_ranks(tmp_path: Path, caches: list[Path]) -> dict:
    out = tmp_path / "out.json"
    with rendezvous.hosted_store() as port:
        mp.spawn(kc.choose_apart, args=(port, [str(c) for c in caches], str(out)), nprocs=2)
    return json.loads(out.read_text())


def test_ranks_that_measure_a_site_apart_run_one_decision(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = run_two_ranks(tmp_path, [cache, cache])
    [winner] = set(result["ran"])
    assert result["kept"] == {"linear": {kc.SITE: winner}} and result["differences"] == []
    recorded = json.loads((choice.directory(cache) / "linear" / f"{kc.SITE}_t1.json").read_text())
    assert (recorded["site"], recorded["winner"]) == (kc.SITE, winner)


def test_ranks_with_caches_of_their_own_run_rank_0s_recorded_decision(tmp_path: Path) -> None:
    caches = [tmp_path / "rank0", tmp_path / "rank1"]
    folder = choice.directory(caches[0]) / "linear"
    folder.mkdir(parents=True)
    (folder / f"{kc.SITE}_t1.json").write_text(
        json.dumps({"kernel": "linear", "shape": f"{kc.SITE}_t1", "site": kc.SITE, "winner": "onednn", "times_ms": {}})
    )
    result = run_two_ranks(tmp_path, caches)
    assert result == {"ran": ["onednn", "onednn"], "kept": {"linear": {kc.SITE: "onednn"}}, "differences": []}
    assert not (caches[1] / "choices").exists()  # rank 1 measured nothing: its own timing would pick aten


def test_ranks_new_to_a_site_with_caches_of_their_own_are_named_at_the_save(tmp_path: Path) -> None:
    result = run_two_ranks(tmp_path, [tmp_path / "rank0", tmp_path / "rank1"])
    assert result == {
        "ran": ["onednn", "aten"],
        "kept": {"linear": {kc.SITE: "onednn"}},
        "differences": [
            f"kernel linear at {kc.SITE}: rank 0 ran onednn, rank 1 ran aten (separate choice caches?); "
            "the checkpoint keeps onednn"
        ],
    }
