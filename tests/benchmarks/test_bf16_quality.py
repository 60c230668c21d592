"""benchmarks/bf16_quality.py's summary: bf16's AUC change per seed and on average, fp32's own spread,
and the rule (|mean change| <= 0.001) on the mean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter: the script sets OpenMP's environment when imported, as a run does.
SCRIPT = """
import json, sys
sys.path.insert(0, "benchmarks")
import bf16_quality
print(json.dumps(bf16_quality.summary(*json.loads(sys.argv[1]))))
"""


def _summary(auc: dict, ne: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps([auc, ne])], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_several_seeds_are_judged_on_their_mean_change_beside_fp32s_spread() -> None:
    auc = {"fp32": [0.712, 0.716, 0.710], "bf16": [0.7137, 0.7150, 0.7095]}
    ne = {"fp32": [0.90, 0.89, 0.91], "bf16": [0.899, 0.891, 0.912]}
    got = _summary(auc, ne)
    assert got.keys() == {"auc_change", "ne_change", "auc_changes", "fp32_auc_stdev", "keep_bf16"}
    assert [round(c, 6) for c in got["auc_changes"]] == [0.0017, -0.001, -0.0005]
    assert round(got["auc_change"], 6) == round((0.0017 - 0.001 - 0.0005) / 3, 6)
    assert round(got["ne_change"], 6) == round((-0.001 + 0.001 + 0.002) / 3, 6)
    assert round(got["fp32_auc_stdev"], 6) == 0.003055
    assert got["keep_bf16"] is True  # one seed moved 0.0017, the mean 0.00007


def test_one_seed_is_judged_on_its_own_change() -> None:
    got = _summary({"fp32": [0.712], "bf16": [0.7105]}, {"fp32": [0.9], "bf16": [0.9]})
    assert got.keys() == {"auc_change", "ne_change", "keep_bf16"}
    assert round(got["auc_change"], 6) == -0.0015 and got["keep_bf16"] is False
