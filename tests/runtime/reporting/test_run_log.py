"""runtime/reporting/run_log.py: metrics.jsonl (appended on a resume), TensorBoard events, the plot."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from runtime.reporting import run_log
from runtime.reporting.run_log import RunLog, history, panels

METRICS = {"click": {"ne": 0.91234567, "auc": None}}


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_the_log_dir_holds_json_lines_tensorboard_events_and_a_plot(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "logs")
    log.begin(0)
    log.train(10, 0.6, 99.0, METRICS)
    log.eval(10, {"click": {"ne": 0.8, "auc": 0.7}})
    log.train(20, 0.5, 101.0, {"click": {"ne": 0.85, "auc": 0.72}})
    log.close({"steps": 20})
    found = records(tmp_path / "logs")
    assert [r["kind"] for r in found] == ["train", "eval", "train", "final"]
    assert found[0]["metrics"] == METRICS and found[-1] == {"kind": "final", "steps": 20}
    shown = panels(history(tmp_path / "logs" / "metrics.jsonl"))
    assert list(shown) == ["loss", "click ne", "click auc"]
    assert shown["click auc"] == {"train": [(20.0, 0.72)], "eval": [(10.0, 0.7)]}
    assert (tmp_path / "logs" / "metrics.png").read_bytes().startswith(b"\x89PNG")
    assert scalars(tmp_path / "logs") == {
        "train/loss": [(10, 0.6), (20, 0.5)],
        "train/samples_per_s": [(10, 99.0), (20, 101.0)],
        "train/click/ne": [(10, 0.912346), (20, 0.85)],
        "train/click/auc": [(20, 0.72)],
        "eval/click/ne": [(10, 0.8)],
        "eval/click/auc": [(10, 0.7)],
    }


def test_a_resumed_run_appends_and_keeps_every_step(tmp_path: Path) -> None:
    first = RunLog(tmp_path)
    first.begin(0)
    for step in range(1, 6):  # killed after step 5; its last checkpoint was step 3
        first.train(step, 1.0 / step, 100.0, {})
    first._stream.close()
    first._writer.close()

    resumed = RunLog(tmp_path)
    resumed.begin(3)
    for step in range(4, 8):
        resumed.train(step, 2.0 / step, 100.0, {})
    resumed.close({"steps": 7})

    kinds = [(r["kind"], r["step"]) for r in records(tmp_path) if "step" in r]
    assert kinds == [("train", s) for s in range(1, 6)] + [("resume", 3)] + [("train", s) for s in range(4, 8)]
    kept = history(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in kept] == [(1, 1.0), (2, 0.5), (3, 1 / 3)] + [
        (step, 2.0 / step) for step in range(4, 8)
    ]
    assert scalars(tmp_path)["train/loss"] == [(s, round(1.0 / s, 6)) for s in (1, 2, 3)] + [
        (s, round(2.0 / s, 6)) for s in range(4, 8)
    ]


def test_a_fresh_run_starts_the_log_afresh(tmp_path: Path) -> None:
    for loss in (0.5, 0.25):
        log = RunLog(tmp_path)
        log.begin(0)
        log.train(1, loss, 1.0, {})
        log.close({"steps": 1})
    assert [r.get("loss") for r in records(tmp_path)] == [0.25, None]


def test_an_evaluation_record_carries_its_unseen_ids(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.begin(0)
    log.eval(5, {"like": {"auc": 0.6}}, {"user_id": 0, "movie_id": 19})
    log.eval(10, {"like": {"auc": 0.7}})
    log.close({"steps": 10})
    assert records(tmp_path)[:2] == [
        {"kind": "eval", "step": 5, "metrics": {"like": {"auc": 0.6}}, "unseen_ids": {"user_id": 0, "movie_id": 19}},
        {"kind": "eval", "step": 10, "metrics": {"like": {"auc": 0.7}}},
    ]


def test_without_tensorboard_or_matplotlib_it_says_so_once_and_keeps_the_json_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setattr(run_log, "_said", set())
    caplog.set_level(logging.WARNING, logger="runtime.reporting.run_log")
    for directory in (tmp_path / "a", tmp_path / "b"):
        log = RunLog(directory)
        log.begin(0)
        log.train(1, 0.5, 1.0, {})
        log.close({"steps": 1})
        assert [r["kind"] for r in records(directory)] == ["train", "final"]
        assert sorted(p.name for p in directory.iterdir()) == ["metrics.jsonl"]
    assert caplog.messages == [
        "--log-dir: tensorboard is not installed, so no TensorBoard events "
        "(pip install 'reccompile[logs]'); writing metrics.jsonl",
        "--log-dir: matplotlib is not installed, so no metrics.png "
        "(pip install 'reccompile[plots]'); metrics.jsonl has every record",
    ]


def test_a_scheduled_run_logs_its_learning_rate_in_every_form(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "logs")
    log.begin(0)
    log.train(1, 0.7, 50.0, METRICS, lr=0.025, lr_scale=0.5)
    log.train(2, 0.6, 60.0, METRICS, lr=0.05, lr_scale=1.0)
    log.close({"steps": 2})
    found = records(tmp_path / "logs")
    assert [(r["lr"], r["lr_scale"]) for r in found if r["kind"] == "train"] == [(0.025, 0.5), (0.05, 1.0)]
    shown = panels(history(tmp_path / "logs" / "metrics.jsonl"))
    assert list(shown)[:2] == ["loss", "lr"] and shown["lr"] == {"train": [(1, 0.025), (2, 0.05)]}
    tensorboard = scalars(tmp_path / "logs")
    assert tensorboard["train/lr"] == [(1, 0.025), (2, 0.05)]
    assert tensorboard["train/lr_scale"] == [(1, 0.5), (2, 1.0)]
