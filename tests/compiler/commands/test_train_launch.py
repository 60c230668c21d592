"""compiler/commands/train_launch.py: a surviving rank's transport error (gloo, shared memory) in the job's words."""

from __future__ import annotations

from compiler.commands.train_launch import _peer_lost

GLOO = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537]"


def test_a_lost_peer_is_one_line_saying_another_rank_stopped() -> None:
    line = (
        f"error: rank 0: pipeline stage 'compute' failed on batch 43: RuntimeError: {GLOO} Read error "
        "[127.0.0.1]:46514: Connection reset by peer. This is typically caused by a remote worker hanging\n"
    )
    assert _peer_lost(line, None) == (
        "error: rank 0: lost its connection to another rank (gloo: Read error [127.0.0.1]:46514: Connection reset "
        "by peer): that rank stopped, on this node or another, and its own output says why; nothing was saved "
        "(no --checkpoint-dir)\n"
    )
    closed = f"error: rank 3: {GLOO} Connection closed by peer [10.0.0.2]:5555\n"
    assert _peer_lost(closed, None).startswith(
        "error: rank 3: lost its connection to another rank (gloo: Connection closed by peer [10.0.0.2]:5555): "
    )


def test_a_peer_gone_from_the_shared_memory_exchange_is_the_same_line() -> None:
    line = (
        "error: rank 0: pipeline stage 'compute' failed on batch 30: ExchangeError: rank 1 (pid 10819) left the "
        "shared-memory exchange while rank 0 waited for it to send its data\n"
    )
    assert _peer_lost(line, None) == (
        "error: rank 0: lost its connection to another rank (shared memory: rank 1 (pid 10819) left the "
        "shared-memory exchange): that rank stopped, on this node or another, and its own output says why; "
        "nothing was saved (no --checkpoint-dir)\n"
    )


def test_other_errors_pass_unchanged() -> None:
    line = "error: rank 1: feature 'a': id 60 out of range for table 'a' with 50 rows\n"
    assert _peer_lost(line, None) == line
