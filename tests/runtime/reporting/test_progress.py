"""Progress: plain lines when not a terminal, a redrawn bar when it is; the log directory's files."""

from __future__ import annotations

import io
import json
from pathlib import Path

from runtime.reporting.progress import Progress, format_metrics
from runtime.reporting.run_log import RunLog

METRICS = {"click": {"ne": 0.91234567, "auc": None}}


def test_plain_lines_without_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(6, out)
    for step in range(1, 7):
        progress.advance(step, 100.0)
        if step % 3 == 0:
            progress.log(step, 0.5, 1234.5, METRICS)
    progress.message("eval     6/6")
    progress.close()
    lines = out.getvalue().splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [["step", "3/6"], ["step", "6/6"]]
    assert lines[0].startswith("step     3/6  loss 0.500000  samples/s 1,234  ETA ")
    assert lines[0].endswith("  click: ne 0.9123 auc -") and lines[2] == "eval     6/6"
    assert "\r" not in out.getvalue()


def test_a_live_bar_on_a_terminal_keeps_lines_above_it() -> None:
    out = io.StringIO()
    progress = Progress(4, out, live=True)
    progress.advance(4, 10.0)
    progress.log(4, 0.25, 10.0, {})
    progress.close()
    text = out.getvalue()
    assert text.startswith("\r\x1b[2K[########################] 4/4  10 samples/s  ETA 0:00:00")
    assert "\r\x1b[2Kstep     4/4  loss 0.250000" in text and text.endswith("\n")
    assert format_metrics({}) == ""


def test_the_log_dir_holds_json_lines_and_a_plot(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "logs")
    log.train(10, 0.6, 99.0, METRICS)
    log.eval(10, {"click": {"ne": 0.8, "auc": 0.7}})
    log.train(20, 0.5, 101.0, {"click": {"ne": 0.85, "auc": 0.72}})
    log.close({"steps": 20})
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["train", "eval", "train", "final"]
    assert records[0]["metrics"] == METRICS and records[-1] == {"kind": "final", "steps": 20}
    assert [p.title for p in log.panels()] == ["loss", "click ne", "click auc"]
    assert [s.name for s in log.panels()[2].series] == ["train", "eval"]
    assert (tmp_path / "logs" / "metrics.png").read_bytes().startswith(b"\x89PNG")
