"""benchmarks/inference_bench.py's lines name the kernels of the process that measured them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from runtime.cpu import choice

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script imports its neighbour `harness`, as it does when run from benchmarks/."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("inference_bench", REPO / "benchmarks" / "inference_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _printing(record: dict) -> list[str]:
    return [sys.executable, "-c", f"print({json.dumps(json.dumps(record))})"]


def test_each_sides_lines_carry_the_measuring_processs_kernels_not_the_parents(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _script()
    monkeypatch.delenv(choice.ENV, raising=False)
    monkeypatch.setattr(choice, "_used", {"dot": {"b1": "torch"}})  # what this (parent) process ran itself
    monkeypatch.setattr(choice, "_forced_used", {})
    ours = {
        "config": "int8",
        "variant": "criteo",
        "batch": 1,
        "p50_ms": 1.0,
        "kernels": {"quant_pool": {"b1_x": "native"}},
    }
    theirs = {"precision": "int8", "variant": "criteo", "batch": 1, "p50_ms": 2.0}
    rows = bench.run_side(_printing(ours), "reccompile", 0) + bench.run_side(_printing(theirs), "torchrec", 0)
    assert [row["kernels"] for row in rows] == [{"quant_pool": {"b1_x": "native"}}, {}]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kernels"] for line in printed] == [{"quant_pool": {"b1_x": "native"}}, {}]
    bench.emit({"sizes": {}})
    assert json.loads(capsys.readouterr().out)["kernels"] == {"dot": {"b1": "torch"}}


def test_the_summary_pairs_each_rounds_runs_of_a_configuration() -> None:
    bench = _script()

    def row(impl: str, round_: int, pair: str, samples: float, **key: object) -> dict:
        name = {"config": pair} if impl == "reccompile" else {"precision": bench.parts(pair)[0]}
        return {
            "impl": impl,
            "round": round_,
            "pair": pair,
            "variant": "criteo",
            "batch": 512,
            "p50_ms": 1.0,
            "p99_ms": 1.0,
            "samples_per_s": samples,
            "other_cpu_pct": 0.0,
            **name,
            **key,
        }

    rows = [
        row("reccompile", 0, "int8", 120.0),
        row("torchrec", 0, "int8", 60.0),  # 2.0
        row("reccompile", 1, "int8", 80.0),
        row("torchrec", 1, "int8", 50.0),  # 1.6: a slow minute for both
        row("reccompile", 2, "int8", 110.0),
        row("torchrec", 2, "int8", 70.0),  # 1.57
        row("torchrec", 2, "int8/bf16", 40.0),  # TorchRec's int8 again, beside another configuration
    ]
    line = next(r for r in bench.summarise(rows, ["int8"], 10.0) if (r["variant"], r["batch"]) == ("criteo", 512))
    assert line["paired_ratios"] == [2.0, 1.6, 1.57]
    assert line["paired_ratio"] == 1.6
    assert line["reccompile_samples_per_s"] == 110.0 and line["torchrec_samples_per_s"] == 55.0
    assert line["ratio"] == 2.0


def test_a_host_gemm_probe_reports_a_positive_speed() -> None:
    assert _script().host_gemm_gflops(0.01) > 0


# A serving process of the --blocks protocol that takes no time: each call "lasts" `ms` milliseconds,
# times the host's `slow` factor for the blocks it is told of (a slow stretch meets both sides), and it
# logs each request to `log` so the order of the turns shows.
FAKE_SERVER = """
import json, sys
name, ms, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
slow = {2: 3.0, 3: 3.0}  # blocks 2 and 3 of each side: the host at a third of its speed
print(json.dumps({"ready": True, "kernels": {"dot": {"b": name}}}), flush=True)
for block, line in enumerate(sys.stdin):
    timed, untimed = (int(n) for n in line.split())
    with open(log, "a") as f:
        f.write(f"{name} {timed} {untimed}\\n")
    print(json.dumps([int(ms * slow.get(block, 1.0) * 1e6)] * timed), flush=True)
"""


def test_blocks_alternate_between_two_live_processes_and_pair_each_block_with_its_neighbour(tmp_path: Path) -> None:
    bench = _script()
    log = tmp_path / "log"
    commands = {
        side: [sys.executable, "-c", FAKE_SERVER, side, ms, str(log)]
        for side, ms in (("reccompile", "1.0"), ("torchrec", "2.0"))
    }
    line = bench.interleave(commands, batch=512, block=10, blocks=6)
    assert log.read_text().split("\n")[:-1] == [
        f"{side} 10 {bench.UNTIMED}"
        for pair in range(3)
        for side in ("reccompile", "torchrec", "torchrec", "reccompile")
    ]
    assert line["block_ratio_median"] == 2.0 and line["block_ratio_quartiles"] == [2.0, 2.0]
    assert line["reccompile_p50_ms"] == 1.0 and line["torchrec_p50_ms"] == 2.0
    # Over all calls: 512 samples per call, ours 4 blocks of 1 ms and 2 of 3 ms a call, TorchRec's twice that.
    assert line["reccompile_samples_per_s"] == round(512 * 60 / ((40 * 1.0 + 20 * 3.0) / 1e3), 1)
    assert line["ratio"] == 2.0
    assert line["kernels"] == {"dot": {"b": "reccompile"}}


def test_a_serving_process_that_dies_ends_the_benchmark_with_its_error(tmp_path: Path) -> None:
    bench = _script()
    dying = [sys.executable, "-c", "import sys; sys.exit('no export in /nowhere')"]
    alive = [sys.executable, "-c", FAKE_SERVER, "torchrec", "1.0", str(tmp_path / "log")]
    with pytest.raises(
        SystemExit, match=r"^error: reccompile's serving process ended \(status 1\):\nno export in /nowhere"
    ):
        bench.interleave({"reccompile": dying, "torchrec": alive}, batch=1, block=4, blocks=2)
