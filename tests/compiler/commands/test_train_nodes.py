"""`reccompile train` on two torchrun nodes of this machine (c10d rendezvous on loopback).

Each node is its own `reccompile train ... --nnodes 2 --node-rank I` with its
own build directory, as two hosts would run it; they share the checkpoint
directory, as hosts share a file system. The reference is one process on the
same global batches (1 node x 1 rank, checkpoints every EVERY steps, all kept).

- 2 nodes x 1 rank plan table_row_wise with one rank per host and train what
  one process does: losses and final tables within 1e-5;
- their checkpoint resumes on 1 node x 2 ranks, which ends where one process does;
- a rank SIGKILLed on one node ends the job on both, the other node naming the
  lost connection and the checkpoint, within a bounded time;
- with --max-restarts 1 both nodes restart from the latest checkpoint and end
  with one process's final tables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime" / "checkpoint"))
import checkpoint_cases as cc  # noqa: E402
import rendezvous  # noqa: E402
from runtime.checkpoint.files import latest_checkpoint  # noqa: E402
from runtime.checkpoint.store import load_model_state  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
STEPS, EVERY, HALF, KILL_AFTER = 120, 20, 60, 30
TOLERANCE = 1e-5
# No column_wise table: its rowwise_adagrad state is per column shard, not one process's.
# Both Adagrads with eps 0.01: with their defaults (1e-10 dense, 1e-8 tables) a row or weight whose
# gradients are rounding noise takes steps of about lr, so the order of a sum across ranks decided where
# 120-step trajectories parted. With 0.01, a kernel's changed rounding (the four-pair dot, e4d441d) keeps
# them within 2e-7, while halving the resumed optimizer state (tables or dense) parts them past the
# tolerance: 1.5e-5 to 5e-4 in the loss.
SPEC = (
    cc.SPEC.replace("ckpt_tiny", "nodes_tiny")
    .replace(
        """    a: {sharding_types: [row_wise]}
    b: {sharding_types: [column_wise]}
    c: {sharding_types: [table_wise]}""",
        """    a: {sharding_types: [table_row_wise]}
    b: {sharding_types: [row_wise]}
    c: {sharding_types: [table_row_wise]}""",
    )
    .replace(
        """  dense_optimizer: {type: adagrad, lr: 0.05}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}""",
        """  dense_optimizer: {type: adagrad, lr: 0.05, eps: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05, eps: 0.01}""",
    )
)
# One thread everywhere: every process reads the same per-site kernel choices (their files are per thread
# count), so the runs differ only by how they are sharded, not by a kernel a busier moment chose.
COMMON = (
    "--batch-size",
    "512",
    "--log-every",
    "1",
    "--checkpoint-every",
    str(EVERY),
    "--keep",
    "100",
    "--threads",
    "1",
)


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def train(*args: str | Path) -> subprocess.CompletedProcess:
    """One node: `reccompile train` to the end."""
    command = [sys.executable, "-m", "compiler.cli", "train", *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)


def listening(port: int) -> bool:
    """Whether a socket listens on `port` of this machine (/proc/net/tcp: state 0A)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":
                return True
    return False


class Nodes:
    """Two `reccompile train` processes joined by a c10d rendezvous at 127.0.0.1:port.

    Node 0 starts first and hosts the rendezvous store (the first to bind the
    port does), so a test may kill anything on node 1 and node 0 still reports.
    """

    def __init__(self, directory: Path, spec: Path, *args: str | Path) -> None:
        self.directory = directory
        port = rendezvous.launcher_port()
        self.processes: list[subprocess.Popen] = []
        for node in (0, 1):
            command = [
                sys.executable,
                "-m",
                "compiler.cli",
                "train",
                str(spec),
                "-o",
                str(directory / f"build{node}"),
                "--nproc",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                directory.name,
                *map(str, args),
            ]
            self.processes.append(
                subprocess.Popen(
                    command,
                    cwd=REPO,
                    env=_env(),
                    text=True,
                    stdout=open(directory / f"out{node}.txt", "w"),
                    stderr=open(directory / f"err{node}.txt", "w"),
                )
            )
            deadline = time.monotonic() + 60
            while node == 0 and not listening(port) and time.monotonic() < deadline:
                time.sleep(0.1)

    def wait(self, timeout: float) -> list[int]:
        """Both exit statuses; past `timeout`, both nodes are killed and the test fails."""
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.processes]
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the nodes ran past {timeout} s:\n{self.err(0)}\n{self.err(1)}") from None

    def stop(self) -> None:
        """SIGKILL both launchers still running: torchrun and the ranks die with them."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    def out(self, node: int) -> str:
        return (self.directory / f"out{node}.txt").read_text()

    def err(self, node: int) -> str:
        return (self.directory / f"err{node}.txt").read_text()

    def printed(self) -> str:
        """Both nodes' stdout: rank 0, whichever node the rendezvous put it on, prints the steps."""
        return self.out(0) + self.out(1)

    def node_of(self, pid: int) -> int:
        """Which node's `reccompile train` process `pid` descends from."""
        launchers = {p.pid: node for node, p in enumerate(self.processes)}
        while pid not in launchers:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert pid > 1, "not a process of these nodes"
        return launchers[pid]

    def kill_after(self, step: int, rank: int, checkpoints: Path) -> int:
        """SIGKILL rank `rank`'s worker once step `step` is printed; the node it ran on."""
        pid = cc.worker_pids(str(checkpoints))[rank]
        node = self.node_of(pid)
        deadline = time.monotonic() + 120
        while f"step {step:>5}/" not in self.printed():
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(self.printed() + self.err(0) + self.err(1))
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        return node


def losses(log_dir: Path) -> dict[int, float]:
    """The losses of the last (re)start in a run's metrics.jsonl, by step."""
    records = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    resumes = [i for i, r in enumerate(records) if r["kind"] == "resume"]
    after = records[resumes[-1] + 1 :] if resumes else records
    return {r["step"]: r["loss"] for r in after if r["kind"] == "train"}


def assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, rtol=TOLERANCE, atol=TOLERANCE, msg=key)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "nodes_tiny.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def one_process(spec: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """STEPS steps on 1 node x 1 rank, a checkpoint every EVERY steps, the log in log/."""
    directory = tmp_path_factory.mktemp("one_process")
    done = train(
        spec,
        "-o",
        directory / "build",
        "--steps",
        STEPS,
        *COMMON,
        "--checkpoint-dir",
        directory / "ck",
        "--log-dir",
        directory / "log",
    )
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture(scope="module")
def two_nodes(spec: Path, tmp_path_factory: pytest.TempPathFactory) -> Nodes:
    """HALF steps on 2 nodes x 1 rank, checkpointed as the one process is."""
    directory = tmp_path_factory.mktemp("two_nodes")
    nodes = Nodes(
        directory, spec, "--steps", HALF, *COMMON, "--checkpoint-dir", directory / "ck", "--log-dir", directory / "log"
    )
    assert nodes.wait(timeout=120) == [0, 0], nodes.err(0) + nodes.err(1)
    return nodes


def test_two_nodes_plan_one_rank_per_host_and_say_so(two_nodes: Nodes) -> None:
    for node in (0, 1):
        first = two_nodes.out(node).splitlines()[0]
        assert first.startswith("training nodes_tiny on 2 ranks (2 nodes × 1 rank): "), first
        plan = json.loads((two_nodes.directory / f"build{node}" / "nodes_tiny.plan.json").read_text())
        row_wise = {
            t["table"]: {s["rank"] for s in t["shards"]}
            for t in plan["tables"]
            if t["sharding_type"] == "table_row_wise"
        }
        # ranks_per_host 1 (torchrun's local world size): each table whole on one host, both hosts used.
        assert sorted(row_wise) == ["a", "c", "e"]
        assert all(len(ranks) == 1 for ranks in row_wise.values()), row_wise
        assert set().union(*row_wise.values()) == {0, 1}, row_wise


def test_two_nodes_of_one_rank_train_what_one_process_does(two_nodes: Nodes, one_process: Path) -> None:
    reference = losses(one_process / "log")
    trained = losses(two_nodes.directory / "log")
    assert sorted(trained) == list(range(1, HALF + 1))
    for step, loss in trained.items():
        assert abs(loss - reference[step]) <= TOLERANCE * abs(reference[step]), (step, loss, reference[step])
    saved = latest_checkpoint(two_nodes.directory / "ck")
    assert saved is not None and saved.name == f"step_{HALF:08d}"
    assert_close(load_model_state(saved), load_model_state(one_process / "ck" / saved.name))


def test_a_checkpoint_of_two_nodes_resumes_on_one_node_of_two_ranks(
    two_nodes: Nodes, one_process: Path, spec: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ck"
    shutil.copytree(two_nodes.directory / "ck", checkpoints)
    done = train(
        spec,
        "-o",
        tmp_path / "build",
        "--nproc",
        "2",
        "--steps",
        STEPS,
        *COMMON,
        "--checkpoint-dir",
        checkpoints,
        "--resume",
        "--log-dir",
        tmp_path / "log",
    )
    assert done.returncode == 0, done.stderr
    assert f"resumed from {checkpoints}/step_{HALF:08d} at step {HALF} (--resume)" in done.stdout
    reference = losses(one_process / "log")
    trained = losses(tmp_path / "log")
    assert sorted(trained) == list(range(HALF + 1, STEPS + 1))
    for step, loss in trained.items():
        assert abs(loss - reference[step]) <= TOLERANCE * abs(reference[step]), (step, loss, reference[step])
    assert_close(load_model_state(checkpoints), load_model_state(one_process / "ck"))


def test_a_rank_killed_on_one_node_ends_the_job_on_both_with_its_error(spec: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "ck"
    nodes = Nodes(tmp_path, spec, "--steps", "100000", *COMMON, "--checkpoint-dir", checkpoints)
    killed = nodes.kill_after(KILL_AFTER, rank=1, checkpoints=checkpoints)
    started = time.monotonic()
    assert nodes.wait(timeout=60) == [1, 1], nodes.err(0) + nodes.err(1)
    assert time.monotonic() - started < 30
    latest = latest_checkpoint(checkpoints)
    assert latest is not None
    where = f"the last checkpoint is {latest}: continue with --resume"
    assert nodes.err(killed).splitlines()[-1] == f"error: rank 1 was killed by signal 9 (SIGKILL); {where}"
    survivor = nodes.err(1 - killed).splitlines()
    lost = [line for line in survivor if line.startswith("error: ")]
    # Both "nodes" run on this host, so the embeddings' all-to-alls go through shared memory and the
    # rest (DDP's all-reduce) through gloo: the survivor learns of the kill from whichever it waited on.
    assert len(lost) == 1, survivor
    assert re.match(r"error: rank 0: lost its connection to another rank \((gloo|shared memory): ", lost[0]), lost
    assert lost[0].endswith(f"): that rank stopped, on this node or another, and its own output says why; {where}")
    assert "Traceback" not in nodes.err(0) + nodes.err(1)


def test_with_max_restarts_two_nodes_resume_after_a_kill_and_end_as_one_process(
    spec: Path, one_process: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ck"
    nodes = Nodes(
        tmp_path,
        spec,
        "--steps",
        STEPS,
        *COMMON,
        "--max-restarts",
        "1",
        "--checkpoint-dir",
        checkpoints,
        "--log-dir",
        tmp_path / "log",
    )
    nodes.kill_after(KILL_AFTER, rank=1, checkpoints=checkpoints)
    assert nodes.wait(timeout=120) == [0, 0], nodes.err(0) + nodes.err(1)
    log = (tmp_path / "log" / "metrics.jsonl").read_text()
    resumed = [json.loads(line) for line in log.splitlines() if json.loads(line)["kind"] == "resume"]
    assert len(resumed) == 1 and EVERY <= resumed[0]["step"] < STEPS, resumed
    reference = losses(one_process / "log")
    trained = losses(tmp_path / "log")
    assert sorted(trained) == list(range(resumed[0]["step"] + 1, STEPS + 1))
    for step, loss in trained.items():
        assert abs(loss - reference[step]) <= TOLERANCE * abs(reference[step]), (step, loss, reference[step])
    assert_close(load_model_state(checkpoints), load_model_state(one_process / "ck"))
