"""runtime/checkpoint/store.py: exact resume at 1 and 2 ranks, resharding 2 -> 1 and 2 -> 4, atomicity, errors.

Losses after a resume must equal the uninterrupted run's exactly (same
batches, same RNG, same optimizer state); tables loaded at another world
size must equal the saved ones exactly (they are copies).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import checkpoint_cases as cc
from runtime.checkpoint import store as checkpoint
from runtime.checkpoint.files import CheckpointError
from runtime.checkpoint.lock import DirectoryLock
from runtime.storage.manifest import file_sha256
from runtime.train.worker import load_module
import rendezvous

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[2]


@pytest.fixture(scope="module", autouse=True)
def _one_thread_per_rank():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # spawned ranks share the cores: no spinning pools
        yield


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    return cc.compile_modules(tmp_path_factory.mktemp("modules"), (1, 2, 4))


@pytest.fixture(scope="module")
def two_ranks(modules: dict[int, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("two_ranks")
    with rendezvous.hosted_store() as port:
        mp.spawn(cc.save_and_resume, args=(port, str(modules[2]), str(out)), nprocs=2)
    return {**torch.load(out / "results.pt"), "directory": out / "checkpoints"}


def one_rank_checkpoint(modules: dict[int, Path], directory: Path, steps: int = 2) -> Path:
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    cc.run_steps(module, model, optimizer, 0, steps)
    return checkpoint.save_checkpoint(
        directory, model, optimizer, step=steps, spec_sha256=module.SPEC_SHA256, plan=module.PLAN
    )


def test_one_rank_resumes_with_the_losses_of_an_uninterrupted_run(modules, tmp_path: Path) -> None:
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    uninterrupted = cc.run_steps(module, model, optimizer, 0, cc.STEPS)

    model, optimizer = cc.fresh(module)
    first = cc.run_steps(module, model, optimizer, 0, cc.SAVED_AT)
    checkpoint.save_checkpoint(
        tmp_path, model, optimizer, step=cc.SAVED_AT, spec_sha256=module.SPEC_SHA256, plan=module.PLAN
    )
    torch.rand(3)  # the global generator moves on; the checkpoint's state must win
    model, optimizer = cc.fresh(module)
    resumed = checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=module.SPEC_SHA256)
    assert resumed.step == cc.SAVED_AT and resumed.path == tmp_path / "step_00000005"
    assert first + cc.run_steps(module, model, optimizer, resumed.step, cc.STEPS) == uninterrupted


def test_two_ranks_resume_with_the_losses_of_an_uninterrupted_run(two_ranks: dict[str, Any]) -> None:
    assert len(two_ranks["resumed"]) == cc.STEPS - cc.SAVED_AT
    assert two_ranks["resumed"] == two_ranks["uninterrupted"]


def test_a_two_rank_checkpoint_loads_in_one_process_with_equal_tables(two_ranks, modules) -> None:
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    checkpoint.load_checkpoint(two_ranks["directory"], model, optimizer, spec_sha256=module.SPEC_SHA256)
    assert_equal_states(cc.full_state(model), two_ranks["saved"])


def test_a_two_rank_checkpoint_loads_on_four_ranks_with_equal_tables(two_ranks, modules, tmp_path):
    out = tmp_path / "state.pt"
    with rendezvous.hosted_store() as port:
        args = (4, port, str(modules[4]), str(two_ranks["directory"]), str(out))
        mp.spawn(cc.load_at, args=args, nprocs=4)
    assert_equal_states(torch.load(out), two_ranks["saved"])


def assert_equal_states(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    assert sorted(k for k in expected if k.startswith("sparse_arch.")) == [f"sparse_arch.{t}.weight" for t in "abcde"]
    for key, tensor in expected.items():
        assert torch.equal(actual[key], tensor), key


def test_load_model_state_is_a_world_size_1_model_state(two_ranks, modules) -> None:
    """The inference export's entry point: one process, no process group, ws1 keys."""
    state = checkpoint.load_model_state(two_ranks["directory"])
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    assert sorted(state) == sorted(model.state_dict())
    for key, tensor in two_ranks["saved"].items():
        assert torch.equal(state[key], tensor), key
    model.load_state_dict(state, strict=True)
    # The rowwise state of `b`, column-split on 2 ranks, reads as the whole table's.
    loaded, loaded_optimizer = cc.fresh(module)
    checkpoint.load_checkpoint(two_ranks["directory"], loaded, loaded_optimizer, spec_sha256=module.SPEC_SHA256)
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(state[key], tensor), key
    one_step = checkpoint.load_model_state(two_ranks["directory"] / "step_00000005")
    assert one_step.keys() == state.keys()


def test_read_manifest(two_ranks, modules) -> None:
    manifest = checkpoint.read_checkpoint_manifest(two_ranks["directory"])
    module = load_module(str(modules[2]))
    assert manifest["step"] == cc.SAVED_AT
    assert manifest["world_size"] == 2
    assert manifest["spec_sha256"] == module.SPEC_SHA256
    assert manifest["plan"] == module.PLAN
    assert manifest["path"] == str(two_ranks["directory"] / "step_00000005")
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


KILLED_SAVE = """
import os, signal, sys, torch
import torch.distributed.checkpoint.filesystem as filesystem
import checkpoint_cases as cc
from runtime.checkpoint import store as checkpoint
from runtime.train.worker import load_module

module = load_module(sys.argv[1])
out, expected = sys.argv[2], sys.argv[3]
model, optimizer = cc.fresh(module)
cc.run_steps(module, model, optimizer, 0, 2)
checkpoint.save_checkpoint(out, model, optimizer, step=2, spec_sha256=module.SPEC_SHA256, plan=module.PLAN)
torch.save(cc.full_state(model), expected)
cc.run_steps(module, model, optimizer, 2, 4)
written, write_item = 0, filesystem._write_item

def write_then_die(*args, **kwargs):
    global written
    result = write_item(*args, **kwargs)
    written += 1
    if written == 3:  # three tensors of the step-4 checkpoint are on disk, the rest are not
        os.kill(os.getpid(), signal.SIGKILL)
    return result

filesystem._write_item = write_then_die
checkpoint.save_checkpoint(out, model, optimizer, step=4, spec_sha256=module.SPEC_SHA256, plan=module.PLAN)
"""


def test_a_save_killed_between_writes_leaves_the_previous_checkpoint_loadable(modules, tmp_path) -> None:
    out, expected = tmp_path / "checkpoints", tmp_path / "expected.pt"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, str(modules[1]), str(out), str(expected)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": f"{REPO}:{TESTS}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    partial = out / ".step_00000004.partial"
    assert (partial / "__0_0.distcp").stat().st_size > 0 and not (partial / ".metadata").exists()
    assert checkpoint.latest_checkpoint(out) == out / "step_00000002"
    assert checkpoint.read_checkpoint_manifest(out)["step"] == 2
    state = checkpoint.load_model_state(out)
    for key, tensor in torch.load(expected).items():
        assert torch.equal(state[key], tensor), key
    # The next save clears what the killed one left.
    one_rank_checkpoint(modules, out, steps=3)
    assert sorted(p.name for p in out.iterdir()) == ["step_00000002", "step_00000003"]


def test_keep_prunes_all_but_the_newest(modules, tmp_path: Path) -> None:
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    for step in (1, 2, 3):
        sha256, plan = module.SPEC_SHA256, module.PLAN
        checkpoint.save_checkpoint(tmp_path, model, optimizer, step=step, spec_sha256=sha256, plan=plan, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000003"]


def test_keep_does_not_count_a_later_checkpoint_a_resume_passed_over(modules, tmp_path: Path) -> None:
    """A run resumed from step 2 because step 4 is damaged keeps its own saves: the damaged one
    neither takes a place of `keep` nor goes, until the run's own step 4 replaces it."""
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    sha256, plan = module.SPEC_SHA256, module.PLAN
    for step in (2, 4):
        checkpoint.save_checkpoint(tmp_path, model, optimizer, step=step, spec_sha256=sha256, plan=plan)
    damage_flip(tmp_path / "step_00000004" / "__0_0.distcp")
    checkpoint.save_checkpoint(tmp_path, model, optimizer, step=3, spec_sha256=sha256, plan=plan, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000004"]
    checkpoint.save_checkpoint(tmp_path, model, optimizer, step=4, spec_sha256=sha256, plan=plan, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004"]
    checkpoint.load_model_state(tmp_path)  # the run's own step 4, intact


def test_keep_spares_a_damaged_checkpoint_the_resume_passed_over_once_the_run_is_past_it(
    modules, tmp_path: Path
) -> None:
    """Resumed from step 2 because step 4 is damaged, a run saving at 3 and 5 keeps its own newest
    `keep`: the damaged step 4, now behind it, neither takes a place nor goes."""
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    sha256, plan = module.SPEC_SHA256, module.PLAN
    for step in (1, 2, 4):
        checkpoint.save_checkpoint(tmp_path, model, optimizer, step=step, spec_sha256=sha256, plan=plan)
    damage_flip(tmp_path / "step_00000004" / "__0_0.distcp")
    resumed = checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=sha256, fall_back=True)
    assert (resumed.step, resumed.damaged) == (2, (tmp_path / "step_00000004",))
    damaged = tmp_path / "step_00000004" / "__0_0.distcp"
    listed = json.loads((damaged.parent / "manifest.json").read_text())["files"]["__0_0.distcp"]["sha256"]
    assert resumed.passed_over == (
        f"{damaged}: sha256 {file_sha256(damaged)[:12]}… does not match manifest.json ({listed[:12]}…); "
        "the file was changed or corrupted",
    )
    for step in (3, 5):
        checkpoint.save_checkpoint(
            tmp_path, model, optimizer, step=step, spec_sha256=sha256, plan=plan, keep=2, damaged=resumed.damaged
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000004", "step_00000005"]


# Errors: each names the file and the problem.


def damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


SHA_DIFFERS = "{f}: sha256 {actual}… does not match manifest.json ({listed}…); the file was changed or corrupted"
DAMAGES = {
    "truncated": (
        "__0_0.distcp",
        damage_truncate,
        "{f}: 100 bytes, manifest.json says {n:,}; the checkpoint is incomplete or corrupted",
    ),
    "missing": ("__0_0.distcp", Path.unlink, "{f}: missing (listed in manifest.json)"),
    "corrupted": ("__0_0.distcp", damage_flip, SHA_DIFFERS),
    "corrupted metadata": (".metadata", damage_flip, SHA_DIFFERS),
    "missing manifest": (
        "manifest.json",
        Path.unlink,
        "{d}: no manifest.json; not a checkpoint directory (a save cut short leaves none)",
    ),
    "corrupted manifest": (
        "manifest.json",
        lambda path: path.write_text('{"step": '),
        "{f}: not valid JSON (Expecting value: line 1 column 10 (char 9))",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_an_error_naming_the_file(modules, tmp_path: Path, damage: str) -> None:
    directory = one_rank_checkpoint(modules, tmp_path)
    name, harm, message = DAMAGES[damage]
    file = directory / name
    size = file.stat().st_size
    listed = json.loads((directory / "manifest.json").read_text())["files"].get(name, {}).get("sha256", "")
    harm(file)
    actual = file_sha256(file)[:12] if file.exists() else ""
    expected = message.format(f=file, n=size, d=directory, actual=actual, listed=listed[:12])
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_model_state(tmp_path)
    assert str(raised.value) == expected
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=module.SPEC_SHA256)
    assert str(raised.value) == expected


def test_a_directory_without_checkpoints_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_model_state(tmp_path)
    assert str(raised.value) == f"no complete checkpoint in {tmp_path} (no step_<N> directory)"
    with pytest.raises(CheckpointError) as raised:
        checkpoint.read_checkpoint_manifest(tmp_path / "nowhere")
    assert str(raised.value) == f"checkpoint directory {tmp_path / 'nowhere'} does not exist"


def test_another_spec_is_refused_unless_allowed(modules, tmp_path: Path) -> None:
    directory = one_rank_checkpoint(modules, tmp_path)
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    other = "0" * 64
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=other)
    assert str(raised.value) == (
        f"{directory}: written for another spec (sha256 {module.SPEC_SHA256[:12]}…, this model's "
        f"spec is 000000000000…); pass --allow-spec-change to load it anyway"
    )
    resumed = checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=other, allow_spec_change=True)
    assert resumed.step == 2 and resumed.skipped == ()


def test_a_changed_table_shape_is_an_error_naming_the_entry(modules, tmp_path: Path) -> None:
    directory = one_rank_checkpoint(modules, tmp_path)
    manifest = json.loads((directory / "manifest.json").read_text())
    bigger = cc.SPEC.replace("{name: a, num_embeddings: 50", "{name: a, num_embeddings: 60")
    module = load_module(str(cc.compile_modules(tmp_path / "bigger", (1,), bigger)[1]))
    model, optimizer = cc.fresh(module)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=module.SPEC_SHA256, allow_spec_change=True)
    assert str(raised.value) == (
        f"{directory}: entry 'model.sparse_arch.a.weight' has shape (50, 8) in the checkpoint but (60, 8) in this model"
    )
    assert manifest["spec_sha256"] != module.SPEC_SHA256


def test_another_dense_optimizer_is_refused_unless_allowed_and_then_starts_afresh(modules, tmp_path: Path) -> None:
    directory = one_rank_checkpoint(modules, tmp_path)
    module = load_module(str(modules[1]))
    model, _ = cc.fresh(module)
    adam = torch.optim.Adam(model.dense_parameters(), lr=0.01)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_checkpoint(tmp_path, model, adam, spec_sha256=module.SPEC_SHA256)
    assert str(raised.value) == (
        f"{directory}: the dense optimizer's state has step, sum, where this run's Adam keeps exp_avg, "
        "exp_avg_sq, step: it was trained with another dense optimizer; pass --allow-spec-change to start "
        "that state afresh"
    )
    resumed = checkpoint.load_checkpoint(tmp_path, model, adam, spec_sha256=module.SPEC_SHA256, allow_spec_change=True)
    assert resumed.skipped == ("optim.* (the state of another dense optimizer: step, sum)",)
    assert adam.state_dict()["state"] == {}
    expected, adagrad = cc.fresh(module)
    checkpoint.load_checkpoint(tmp_path, expected, adagrad, spec_sha256=module.SPEC_SHA256)
    assert_equal_states(cc.full_state(model), cc.full_state(expected))  # the model itself loaded


def test_adamw_resumes_with_the_losses_of_an_uninterrupted_run(tmp_path: Path) -> None:
    """AdamW's defaults hold a key its constructor does not take (decoupled_weight_decay, torch 2.13):
    the check of the saved state's names must still make its twin."""
    adamw = cc.SPEC.replace("dense_optimizer: {type: adagrad, lr: 0.05}", "dense_optimizer: {type: adamw, lr: 0.05}")
    module = load_module(str(cc.compile_modules(tmp_path / "adamw", (1,), adamw)[1]))
    model, optimizer = cc.fresh(module)
    assert type(optimizer) is torch.optim.AdamW
    uninterrupted = cc.run_steps(module, model, optimizer, 0, cc.STEPS)
    model, optimizer = cc.fresh(module)
    first = cc.run_steps(module, model, optimizer, 0, cc.SAVED_AT)
    checkpoint.save_checkpoint(
        tmp_path / "ckpt", model, optimizer, step=cc.SAVED_AT, spec_sha256=module.SPEC_SHA256, plan=module.PLAN
    )
    model, optimizer = cc.fresh(module)
    resumed = checkpoint.load_checkpoint(tmp_path / "ckpt", model, optimizer, spec_sha256=module.SPEC_SHA256)
    assert first + cc.run_steps(module, model, optimizer, resumed.step, cc.STEPS) == uninterrupted


def test_another_table_optimizer_is_refused_unless_allowed_and_then_starts_afresh(modules, tmp_path: Path) -> None:
    """A rowwise_adagrad checkpoint (momentum1 per row) resumed with sparse adam (momentum1 and
    momentum2 per value, iter): refused; allowed, the tables' weights load and adam starts afresh."""
    directory = one_rank_checkpoint(modules, tmp_path)
    adam = cc.SPEC.replace(
        "sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}", "sparse_optimizer: {type: adam, lr: 0.05}"
    )
    module = load_module(str(cc.compile_modules(tmp_path / "adam", (1,), adam)[1]))
    model, optimizer = cc.fresh(module)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=module.SPEC_SHA256, allow_spec_change=False)
    assert str(raised.value).startswith(f"{directory}: written for another spec")  # the spec changed, so:
    fresh_state = {k: v.clone() for k, v in model.state_dict().items()}
    resumed = checkpoint.load_checkpoint(
        tmp_path, model, optimizer, spec_sha256=module.SPEC_SHA256, allow_spec_change=True
    )
    assert [entry for entry in resumed.skipped if "table optimizer" in entry] == [
        f"sparse_arch.{table}.* optimizer state (another table optimizer's: momentum1 per row)" for table in "abcde"
    ]
    saved = checkpoint.load_model_state(tmp_path)
    tables = cc.full_state(model)
    for table in "abcde":
        assert torch.equal(tables[f"sparse_arch.{table}.weight"], saved[f"sparse_arch.{table}.weight"]), table
    states = [key for key in fresh_state if key.endswith((".momentum1", ".momentum2", ".iter"))]
    assert len(states) >= 5 * 2
    for key in states:
        assert torch.equal(model.state_dict()[key], fresh_state[key]), key  # adam's own fresh state


def test_a_table_optimizer_changed_under_the_same_spec_hash_is_named(modules, tmp_path: Path) -> None:
    """The check itself, without the spec's hash in front of it: the message names table and states."""
    directory = one_rank_checkpoint(modules, tmp_path)
    adam = cc.SPEC.replace(
        "sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}", "sparse_optimizer: {type: adam, lr: 0.05}"
    )
    module = load_module(str(cc.compile_modules(tmp_path / "adam", (1,), adam)[1]))
    model, optimizer = cc.fresh(module)
    saved_sha256 = json.loads((directory / "manifest.json").read_text())["spec_sha256"]
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_checkpoint(tmp_path, model, optimizer, spec_sha256=saved_sha256)
    assert str(raised.value) == (
        f"{directory}: table 'a' has the optimizer state momentum1 per row, where this run's table optimizer "
        "keeps iter, momentum1 per value, momentum2 per value: it was trained with another table optimizer; "
        "pass --allow-spec-change to start that state afresh"
    )


def test_adams_state_is_not_taken_for_adagrads_of_the_same_shape(tmp_path: Path) -> None:
    """Sparse adam's momentum1 (signed) has elementwise adagrad's shape: it must not load as
    adagrad's sum of squares (that trained to NaN), but be refused, or, allowed, start afresh."""
    spec = cc.SPEC.replace("    b: {sharding_types: [column_wise]}\n", "")
    modules = {}
    for name in ("adam", "adagrad"):
        text = spec.replace("{type: rowwise_adagrad, lr: 0.05}", f"{{type: {name}, lr: 0.05}}")
        modules[name] = load_module(str(cc.compile_modules(tmp_path / name, (1,), text)[1]))
    model, optimizer = cc.fresh(modules["adam"])
    cc.run_steps(modules["adam"], model, optimizer, 0, 2)
    saved = checkpoint.save_checkpoint(
        tmp_path / "ck", model, optimizer, step=2, spec_sha256="same", plan=modules["adam"].PLAN
    )
    model, optimizer = cc.fresh(modules["adagrad"])
    with pytest.raises(CheckpointError) as raised:
        checkpoint.load_checkpoint(tmp_path / "ck", model, optimizer, spec_sha256="same")
    assert str(raised.value) == (
        f"{saved}: table 'a' has the optimizer state iter, momentum1 per value, momentum2 per value, where this "
        "run's table optimizer keeps momentum1 per value: it was trained with another table optimizer; "
        "pass --allow-spec-change to start that state afresh"
    )
    resumed = checkpoint.load_checkpoint(tmp_path / "ck", model, optimizer, spec_sha256="same", allow_spec_change=True)
    assert len([entry for entry in resumed.skipped if "another table optimizer" in entry]) == 5
    momenta = [v for k, v in model.state_dict().items() if k.endswith(".momentum1")]
    assert momenta and all(bool((m == 0).all()) for m in momenta)  # adagrad's fresh sums, not adam's exp_avg


def test_a_failed_write_says_how_much_space_is_left(modules, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At one rank a full disk surfaces as torch's zip writer's 'unexpected pos 704 vs 598': the
    message adds what the file system has free."""
    from collections import namedtuple

    from torch.distributed.checkpoint import filesystem

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(filesystem, "_write_item", full)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda path: usage(1 << 20, (1 << 20) - 4096, 4096))
    module = load_module(str(modules[1]))
    model, optimizer = cc.fresh(module)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.save_checkpoint(tmp_path, model, optimizer, step=1, spec_sha256=module.SPEC_SHA256, plan=module.PLAN)
    assert str(raised.value) == (
        f"{tmp_path}/.step_00000001.partial: writing the checkpoint failed: rank 0: RuntimeError: "
        "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598; its file system has 4,096 bytes free"
    )


def test_a_checkpoint_folder_whose_lock_cannot_be_written_is_named_as_the_option(tmp_path: Path) -> None:
    """A read-only folder (or anything that stops the lock file) names --checkpoint-dir, not just errno
    30; a folder where the lock file would go provokes it for any user, root included."""
    (tmp_path / ".lock").mkdir()
    with pytest.raises(CheckpointError) as raised:
        DirectoryLock(tmp_path)
    assert (
        str(raised.value) == f"--checkpoint-dir {tmp_path}: cannot write its lock file {tmp_path}/.lock: Is a directory"
    )
