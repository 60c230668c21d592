"""runtime/reporting/console.py: plain lines when not a terminal, a tqdm bar below them when it is."""

from __future__ import annotations

import io
import json

from runtime.reporting.console import Console, format_metrics, result

METRICS = {"click": {"ne": 0.91234567, "auc": None}}


def test_plain_lines_without_a_terminal() -> None:
    out = io.StringIO()
    console = Console(6, out)
    for step in range(1, 7):
        console.advance(step, 100.0)
        if step % 3 == 0:
            console.log(step, 0.5, 1234.5, METRICS)
    console.message("eval     6/6")
    console.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert [line.split()[:2] for line in lines[:2]] == [["step", "3/6"], ["step", "6/6"]]
    assert lines[0].startswith("step     3/6  loss 0.500000  samples/s 1,234  ETA 0:00:0")
    assert lines[0].endswith("  click: ne 0.9123 auc -") and lines[2] == "eval     6/6"
    assert "\r" not in out.getvalue()


def test_a_scheduled_run_shows_its_learning_rate_after_the_loss() -> None:
    out = io.StringIO()
    console = Console(2, out)
    console.advance(1, 10.0)
    console.log(1, 0.5, 10.0, {}, lr=0.0123456)
    assert out.getvalue().startswith("step     1/2  loss 0.500000  lr 0.01235  samples/s 10  ETA 0:00:0")


def test_a_tqdm_bar_on_a_terminal_keeps_lines_above_it() -> None:
    out = io.StringIO()
    console = Console(4, out, live=True)
    console.advance(3, 10.0)  # a run resumed after step 2
    console.advance(4, 10.0)
    console.log(4, 0.25, 10.0, {})
    console.close()
    text = out.getvalue()
    assert "\r" in text  # the bar is redrawn in place
    assert "\rstep     4/4  loss 0.250000  samples/s 10  ETA 0:00:00\n" in text  # tqdm.write: bar cleared first
    assert "4/4 [" in text and "10 samples/s" in text  # tqdm's count and our postfix
    assert text.endswith("\n")
    assert format_metrics({}) == ""


def test_the_result_is_one_json_line() -> None:
    out = io.StringIO()
    result({"steps": 2, "loss_last": 0.5}, out)
    assert out.getvalue() == '{"steps": 2, "loss_last": 0.5}\n'
    assert json.loads(out.getvalue()) == {"steps": 2, "loss_last": 0.5}


def test_a_rate_not_yet_measured_shows_a_dash_not_zero() -> None:
    out = io.StringIO()
    console = Console(1, out)
    console.advance(1, None)
    console.log(1, 0.5, None, {})
    assert out.getvalue().startswith("step     1/1  loss 0.500000  samples/s -  ETA 0:00:0")
