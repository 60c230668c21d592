"""ruff and mypy over the tree, held to a baseline of findings that may shrink but never grow; ruff format over it.

The baseline (tests/golden/static_checks.txt) counts findings per tool, file and rule: a change
that adds a finding fails here with the findings of that file and rule; one that removes findings
passes, and `pytest tests/test_static_checks.py --update-static-baseline` lowers the baseline to match
(a switch of its own: `--update-goldens` must never raise it by the way).
Both tools are pinned (pyproject.toml's `test` extra): another version finds other things.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "tests" / "golden" / "static_checks.txt"
BIN = Path(sys.executable).parent

Key = tuple[str, str, str]  # tool, file, rule


def ruff_findings() -> dict[Key, list[str]]:
    done = subprocess.run(
        [
            str(BIN / "ruff"),
            "check",
            "--output-format",
            "json",
            "--no-cache",
            "compiler",
            "runtime",
            "tests",
            "benchmarks",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    found: dict[Key, list[str]] = {}
    for item in json.loads(done.stdout):
        path = str(Path(item["filename"]).relative_to(REPO))
        line = f"{path}:{item['location']['row']}: {item['code']} {item['message']}"
        found.setdefault(("ruff", path, item["code"] or "syntax"), []).append(line)
    return found


_MYPY_LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*?)(?:  \[(?P<code>[a-z-]+)\])?$")


def mypy_findings() -> dict[Key, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "--show-absolute-path"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    found: dict[Key, list[str]] = {}
    for line in done.stdout.splitlines():
        match = _MYPY_LINE.match(line)
        if match is None:
            continue  # notes that belong to the error above them
        path = str(Path(match["path"]).relative_to(REPO))
        found.setdefault(("mypy", path, match["code"] or "misc"), []).append(
            f"{path}:{match['line']}: {match['message']}"
        )
    return found


def read_baseline() -> Counter[Key]:
    counts: Counter[Key] = Counter()
    if BASELINE.exists():
        for row in BASELINE.read_text().splitlines():
            tool, path, rule, count = row.split()
            counts[(tool, path, rule)] = int(count)
    return counts


def write_baseline(found: dict[Key, list[str]]) -> None:
    rows = [f"{tool} {path} {rule} {len(lines)}" for (tool, path, rule), lines in sorted(found.items())]
    BASELINE.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_no_finding_beyond_the_baseline(tool: str, request: pytest.FixtureRequest) -> None:
    found = ruff_findings() if tool == "ruff" else mypy_findings()
    baseline = read_baseline()
    if request.config.getoption("--update-static-baseline"):
        others = {key: ["x"] * count for key, count in baseline.items() if key[0] != tool}
        write_baseline({**others, **found})
        return
    grown = [
        f"{key[1]} {key[2]}: {len(lines)} findings, the baseline allows {baseline[key]}:\n  " + "\n  ".join(lines)
        for key, lines in sorted(found.items())
        if len(lines) > baseline[key]
    ]
    assert not grown, f"{tool} found more than its baseline (tests/golden/static_checks.txt):\n" + "\n".join(grown)


def test_the_tree_is_formatted() -> None:
    """`ruff format` (its settings in pyproject.toml) leaves every file as it is: the house's one layout."""
    done = subprocess.run(
        [str(BIN / "ruff"), "format", "--check", "--no-cache", "compiler", "runtime", "tests", "benchmarks"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
