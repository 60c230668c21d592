"""Tests for runtime/cpu/choice.py: measured, recorded once per CPU and shape (per site in a run), forced by the environment."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from runtime.cpu import choice, features, threads

_core_held_since = choice._core_held_since


@pytest.fixture(autouse=True)
def _cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice.ENV, raising=False)
    monkeypatch.setattr(choice, "_core_held_since", lambda before: False)  # a quiet machine, whatever its load


def _sleeper(ms: float, calls: list[str], name: str) -> Callable[[], None]:
    def run() -> None:
        calls.append(name)
        time.sleep(ms / 1e3)

    return run


def _never() -> None:
    raise AssertionError("measured although the choice was known")


def test_the_faster_wins_is_recorded_and_is_not_measured_again(tmp_path: Path) -> None:
    calls: list[str] = []
    runs = {"aten": _sleeper(15, calls, "aten"), "onednn": _sleeper(1, calls, "onednn")}
    assert choice.choose("linear", "b2048_in13_out512", runs) == "onednn"
    assert calls == ["aten", "onednn"] + ["aten", "onednn"] * choice.REPEATS  # warm-up, then interleaved
    assert choice.choose("linear", "b2048_in13_out512", {"aten": _never, "onednn": _never}) == "onednn"

    path = choice.directory(tmp_path) / "linear" / "b2048_in13_out512.json"
    record = json.loads(path.read_text())
    assert (record["kernel"], record["winner"], record["cpu"]) == ("linear", "onednn", features.model())
    assert sorted(record["times_ms"]) == ["aten", "onednn"]
    assert record["times_ms"]["aten"] > record["times_ms"]["onednn"] >= 1.0
    [recorded] = choice.recorded()
    assert (recorded.kernel, recorded.shape, recorded.winner) == ("linear", "b2048_in13_out512", "onednn")
    assert choice.active() == {"linear": {"b2048_in13_out512": "onednn"}}


def test_a_call_that_times_itself_is_judged_by_its_own_time_not_its_preparation(tmp_path: Path) -> None:
    """The baseline prepares for 20 ms and says its kernel took 1 ms; the alternative takes 5 ms plainly."""

    def prepared() -> choice.Timed:
        time.sleep(0.02)
        return choice.Timed(1.0)

    assert choice.choose("linear", "b8", {"aten": prepared, "onednn": _sleeper(5, [], "onednn")}) == "aten"
    record = json.loads((choice.directory(tmp_path) / "linear" / "b8.json").read_text())
    assert record["times_ms"]["aten"] == 1.0
    assert record["times_ms"]["onednn"] >= 5.0


def test_runs_given_as_a_function_are_made_only_when_a_measurement_runs() -> None:
    calls: list[str] = []
    made: list[int] = []

    def runs() -> dict[str, Callable[[], None]]:
        made.append(1)
        return {"aten": _sleeper(15, calls, "aten"), "onednn": _sleeper(1, calls, "onednn")}

    def never_made() -> dict[str, Callable[[], None]]:
        raise AssertionError("the runs were made although the choice was known")

    assert choice.choose("linear", "lazy", runs) == "onednn"
    assert made == [1] and calls == ["aten", "onednn"] + ["aten", "onednn"] * choice.REPEATS
    assert choice.choose("linear", "lazy", never_made) == "onednn"  # from memory
    choice.forget_used()
    assert choice.choose("linear", "lazy", never_made) == "onednn"  # from disk


def test_a_choice_measured_another_way_or_for_other_c_sources_is_measured_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An older reccompile's record is not trusted for good: the directory is keyed by the calibration
    (repeats, windows, margins), the kernels compared and the native sources, so the choice is
    measured afresh beside it."""
    calls: list[str] = []
    first = choice.directory()
    onednn_faster = {"aten": _sleeper(15, calls, "aten"), "onednn": _sleeper(1, calls, "onednn")}
    assert choice.choose("linear", "b64", onednn_faster) == "onednn"

    monkeypatch.setattr(choice, "WINDOWS", {**choice.WINDOWS, "linear": 0.05})
    choice.forget_used()  # a new process, as far as the memo goes
    second = choice.directory()
    assert second != first and second.parent == first.parent == tmp_path / "choices" / features.identity()
    calls.clear()
    aten_faster = {"aten": _sleeper(1, calls, "aten"), "onednn": _sleeper(15, calls, "onednn")}
    assert choice.choose("linear", "b64", aten_faster) == "aten"
    assert len(calls) > 2 * choice.REPEATS  # measured again, over the longer window
    assert json.loads((first / "linear" / "b64.json").read_text())["winner"] == "onednn"  # the old record stays

    source = tmp_path / "kernel.c"
    source.write_text("int f(void) { return 1; }\n")
    monkeypatch.setattr(choice, "SOURCES", (source,))
    choice._sources_digest.cache_clear()
    third = choice.directory()
    source.write_text("int f(void) { return 2; }\n")
    choice._sources_digest.cache_clear()
    assert len({second, third, choice.directory()}) == 3
    choice._sources_digest.cache_clear()

    fourth = choice.directory()
    monkeypatch.setattr(choice, "KERNELS", {**choice.KERNELS, "new_kernel": ("torch", "native")})
    assert choice.directory() != fourth  # a new kernel may change what an old one's alternative runs
    choice._sources_digest.cache_clear()  # digested from the fake source: later tests digest the real ones


def test_the_baseline_stays_unless_the_alternative_is_clearly_faster() -> None:
    calls: list[str] = []
    slower = {"torch": _sleeper(1, calls, "torch"), "native": _sleeper(15, calls, "native")}
    assert choice.choose("dot", "slower", slower) == "torch"
    level = {"fbgemm": _sleeper(5, calls, "fbgemm"), "native": _sleeper(5, calls, "native")}
    assert choice.choose("quant_pool", "level", level) == "fbgemm"


def test_a_serving_mlp_takes_whichever_way_is_faster_with_no_margin() -> None:
    calls: list[str] = []
    behind = {"aten": _sleeper(20, calls, "aten"), "packed": _sleeper(21, calls, "packed")}  # 5% behind
    assert choice.choose("packed_mlp", "behind", behind) == "aten"
    ahead = {"aten": _sleeper(21, calls, "aten"), "packed": _sleeper(20, calls, "packed")}  # 5% ahead
    assert choice.choose("packed_mlp", "ahead", ahead) == "packed"
    assert choice.choose("linear", "ahead", {"aten": ahead["aten"], "onednn": ahead["packed"]}) == "onednn"
    assert choice.choose("dot", "ahead", {"torch": ahead["aten"], "native": ahead["packed"]}) == "native"
    close = {"torch": _sleeper(20.4, calls, "torch"), "native": _sleeper(20, calls, "native")}  # 2% ahead
    assert choice.choose("dot", "close", close) == "torch"  # other kernels keep their 3% margin


def test_a_serving_mlp_is_timed_over_its_window_so_a_slow_phase_does_not_decide() -> None:
    """'packed' is slow for as many calls as an unwindowed choice makes (a warm-up and REPEATS
    rounds) and fast after: only a kernel timed over WINDOWS' 0.3 s sees both phases. The phase
    ends by count, not by clock, so a loaded machine's late sleeps cannot move it."""

    def phased(calls: list[str]) -> dict[str, Callable[[], None]]:
        def packed() -> None:
            calls.append("packed")
            time.sleep(0.020 if calls.count("packed") <= 1 + choice.REPEATS else 0.010)

        return {"aten": _sleeper(15, calls, "aten"), "packed": packed}

    assert choice.WINDOWS["packed_mlp"] == 0.3
    calls: list[str] = []
    assert choice.choose("packed_mlp", "phases", phased(calls)) == "packed"
    assert calls.count("packed") > 1 + choice.REPEATS
    calls = []
    runs = phased(calls)
    assert choice.choose("linear", "phases", {"aten": runs["aten"], "onednn": runs["packed"]}) == "aten"
    assert calls.count("packed") == 1 + choice.REPEATS


def test_serving_pooling_is_timed_over_a_tenth_of_a_second() -> None:
    calls: list[str] = []
    runs = {"fbgemm": _sleeper(4, calls, "fbgemm"), "native": _sleeper(2, calls, "native")}
    began = time.perf_counter()
    assert choice.choose("quant_pool", "window", runs) == "native"
    assert time.perf_counter() - began >= choice.WINDOWS["quant_pool"] == 0.1
    assert calls.count("native") >= 1 + choice.REPEATS


@pytest.mark.parametrize("busy", [True, False])
def test_a_windowed_choice_measured_while_another_process_held_a_core_is_used_but_not_recorded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, busy: bool
) -> None:
    # /proc/stat over the measurement: 1,000 s of CPU time, none of it idle (busy) or all of it (quiet)
    after = [100_000, 0, 0, 0, 0, 0, 0] if busy else [0, 0, 0, 100_000, 0, 0, 0]
    readings = iter([[0] * 7, after])
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(readings))
    monkeypatch.setattr(choice, "_core_held_since", _core_held_since)
    calls: list[str] = []
    runs = {"fbgemm": _sleeper(4, calls, "fbgemm"), "native": _sleeper(2, calls, "native")}
    assert choice.choose("quant_pool", "probed", runs) == "native"
    assert choice.choose("quant_pool", "probed", {"fbgemm": _never, "native": _never}) == "native"  # from memory
    assert (choice.directory(tmp_path) / "quant_pool" / "probed.json").exists() is not busy
    assert next(readings, None) is None  # probed before and after the window


def test_an_unwindowed_choice_is_recorded_without_a_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(threads, "_cpu_times", _never)
    monkeypatch.setattr(choice, "_core_held_since", _core_held_since)
    assert choice.choose("dot", "b512", _fast_native()) == "native"
    assert (choice.directory(tmp_path) / "dot" / "b512.json").exists()


def test_a_choice_already_on_disk_stands(tmp_path: Path) -> None:
    folder = choice.directory(tmp_path) / "lookup"
    folder.mkdir(parents=True)
    (folder / "b4096_g2.json").write_text(
        json.dumps(
            {
                "kernel": "lookup",
                "shape": "b4096_g2",
                "winner": "sequential",
                "times_ms": {"sequential": 1, "concurrent": 2},
            }
        )
    )
    assert choice.choose("lookup", "b4096_g2", {"sequential": _never, "concurrent": _never}) == "sequential"


def test_the_environment_forces_a_choice_without_measuring_or_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "dot=torch, linear=onednn")
    assert choice.choose("dot", "b1", {"torch": _never, "native": _never}) == "torch"
    assert choice.choose("linear", "b1", {"aten": _never, "onednn": _never}) == "onednn"
    assert choice.recorded() == []
    assert choice.active() == {"dot": {"*": "torch"}, "linear": {"*": "onednn"}}


def test_a_bad_override_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(choice.ENV, "dot=native,linear=mkl")
    with pytest.raises(ValueError) as err:
        choice.choose("dot", "b1", {"torch": _never, "native": _never})
    assert str(err.value) == (
        "RECCOMPILE_KERNELS: 'linear=mkl' is not a kernel choice; expected comma-separated "
        "dot=torch|native, linear=aten|onednn, lookup=sequential|concurrent, quant_pool=fbgemm|native, "
        "pool_team=one|team, attention=torch|native, embedding_update=fbgemm|native, linear_grad_input=plain|padded, "
        "linear_grad_weight=mm|onednn, packed_mlp=aten|packed, mlp_int8=float|int8, softmax_gemm=fp32|bf16, "
        "attention_precision=autocast|fp32, in_batch_softmax=torch|native, dense_step=team|one"
    )


def test_without_a_writable_cache_the_baseline_runs_unmeasured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(blocker))
    assert choice.choose("dot", "b1", {"torch": _never, "native": _never}) == "torch"


def _fast_native() -> dict[str, Callable[[], None]]:
    return {"torch": _sleeper(8, [], "torch"), "native": _sleeper(1, [], "native")}


@pytest.mark.parametrize(
    "junk",
    [
        "",  # a crash between creating and writing
        '{"winner": "native", "times_ms": {"torch": 1.0, "nat',
        '{"winner": null, "times_ms": {}}',
        '{"winner": "bogus", "times_ms": {}}',
        '{"winner": "native", "times_ms": [1, 2]}',
        '{"winner": "native", "times_ms": {}, "site": 3}',
        "[]",
        b"\x9a\xef\xbb\xbf\xffrandom\x00bytes",  # overwritten with junk: not even UTF-8
        "[" * 100_000,  # nested past the parser's recursion limit
    ],
)
def test_a_file_that_is_not_a_choice_is_measured_again_and_replaced(
    junk: str | bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = choice.directory(tmp_path) / "dot"
    folder.mkdir(parents=True)
    junk = junk if isinstance(junk, bytes) else junk.encode()
    (folder / "b512.json").write_bytes(junk)
    assert choice.recorded() == []
    assert choice.choose("dot", "b512", _fast_native()) == "native"
    assert (folder / "b512.json.bad").read_bytes() == junk
    assert json.loads((folder / "b512.json").read_text())["winner"] == "native"
    assert [(c.kernel, c.shape, c.winner) for c in choice.recorded()] == [("dot", "b512", "native")]
    assert caplog.messages == [
        f"reccompile: kernel choice {folder / 'b512.json'} does not read as one; measured again, kept as b512.json.bad"
    ]


def test_a_folder_in_a_choice_files_place_is_measured_again_and_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = choice.directory(tmp_path) / "dot"
    (folder / "b512.json").mkdir(parents=True)
    assert choice.choose("dot", "b512", _fast_native()) == "native"
    assert (folder / "b512.json.bad").is_dir()
    assert json.loads((folder / "b512.json").read_text())["winner"] == "native"
    assert caplog.messages == [
        f"reccompile: kernel choice {folder / 'b512.json'} does not read as one; measured again, kept as b512.json.bad"
    ]


def test_a_choice_that_cannot_be_recorded_is_still_used_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = choice.directory(tmp_path)
    root.mkdir(parents=True)
    (root / "dot").write_text("a file where the kernel's folder should be")
    assert choice.choose("dot", "b512", _fast_native()) == "native"
    assert choice.choose("dot", "b512", {"torch": _never, "native": _never}) == "native"  # from memory
    [message] = caplog.messages
    assert message.startswith(
        f"reccompile: kernel choice dot at b512 cannot be recorded in {root} ([Errno 17] File exists"
    )
    assert message.endswith("); this process uses native")


def test_recorded_choices_are_readable_by_others_sharing_the_cache(tmp_path: Path) -> None:
    choice.choose("dot", "b512", _fast_native())
    assert (choice.directory(tmp_path) / "dot" / "b512.json").stat().st_mode & 0o777 == 0o644


def test_shape_keys_must_be_file_name_safe() -> None:
    with pytest.raises(ValueError, match=r"^kernel choice 'dot': shape key '\.\./x' is not file-name safe$"):
        choice.choose("dot", "../x", {"torch": _never, "native": _never})


def test_buckets_are_powers_of_two() -> None:
    assert [choice.bucket(n) for n in (0, 1, 2, 3, 512, 513, 2048)] == [1, 1, 2, 4, 512, 1024, 2048]


def _record(tmp_path: Path, kernel: str, key: str, winner: str, site: str | None = None) -> None:
    folder = choice.directory(tmp_path) / kernel
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key}.json").write_text(
        json.dumps(
            {"kernel": kernel, "shape": key, **({"site": site} if site else {}), "winner": winner, "times_ms": {}}
        )
    )


def test_in_a_run_a_numeric_kernel_is_chosen_once_per_site_whatever_the_later_shapes(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    _record(tmp_path, "embedding_update", "b512_ids2048_tables2_plain_t1", "native")  # a per-shape choice
    calls: list[str] = []
    runs = {"fbgemm": _sleeper(1, calls, "fbgemm"), "native": _sleeper(15, calls, "native")}
    with choice.run():
        assert (
            choice.choose("embedding_update", "b512_ids1024_tables2_plain_t1", runs, site="tables2_plain") == "fbgemm"
        )
        # A batch with more ids: outside a run that shape's own record would decide (native).
        never = {"fbgemm": _never, "native": _never}
        assert (
            choice.choose("embedding_update", "b512_ids2048_tables2_plain_t1", never, site="tables2_plain") == "fbgemm"
        )
        assert choice.pinned() == {"embedding_update": {"tables2_plain": "fbgemm"}}
    assert choice.pinned() == {}
    assert choice.choose("embedding_update", "b512_ids2048_tables2_plain_t1", never, site="tables2_plain") == "native"
    made = {c.shape: c for c in choice.recorded()}
    assert made[f"tables2_plain_t{threads}"].site == "tables2_plain"
    assert made[f"tables2_plain_t{threads}"].winner == "fbgemm"
    assert choice.sites() == {"embedding_update": {"tables2_plain": "fbgemm"}}


def test_a_kernel_that_keeps_its_numerics_is_still_chosen_per_shape_in_a_run(tmp_path: Path) -> None:
    _record(tmp_path, "lookup", "b64_ids64", "concurrent")
    _record(tmp_path, "lookup", "b64_ids128", "sequential")
    never = {"sequential": _never, "concurrent": _never}
    with choice.run():
        assert choice.choose("lookup", "b64_ids64", never, site="groups2") == "concurrent"
        assert choice.choose("lookup", "b64_ids128", never, site="groups2") == "sequential"
        assert choice.pinned() == {}


def test_pinned_choices_hold_over_the_cache_and_known_ones_over_measuring(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    _record(tmp_path, "dot", f"n3_d4_fwdbwd_t{threads}", "torch", site="n3_d4_fwdbwd")
    never = {"torch": _never, "native": _never}
    with choice.run():
        assert choice.pin({"dot": {"n3_d4_fwdbwd": "native"}}) == []
        choice.know({"linear": {"in8_out4_fwdbwd": "onednn"}})
        assert choice.choose("dot", "b64_n3_d4_fwdbwd", never, site="n3_d4_fwdbwd") == "native"
        assert (
            choice.choose("linear", "b64_in8_out4_fwdbwd", {"aten": _never, "onednn": _never}, site="in8_out4_fwdbwd")
            == "onednn"
        )
        assert choice.pinned() == {"dot": {"n3_d4_fwdbwd": "native"}, "linear": {"in8_out4_fwdbwd": "onednn"}}


def test_the_environment_still_forces_a_pinned_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    with choice.run():
        choice.pin({"dot": {"n3_d4_fwdbwd": "native"}})
        monkeypatch.setenv(choice.ENV, "dot=torch")
        assert (
            choice.choose("dot", "b64_n3_d4_fwdbwd", {"torch": _never, "native": _never}, site="n3_d4_fwdbwd")
            == "torch"
        )
        assert choice.pinned() == {"dot": {"n3_d4_fwdbwd": "torch"}}


def test_a_recorded_choice_this_machine_cannot_run_falls_back_to_the_baseline_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime.cpu.native import build

    monkeypatch.setenv("CC", "no-such-cc")
    build.status.cache_clear()
    try:
        with choice.run():
            problems = choice.pin({"embedding_update": {"tables2_plain": "native"}, "dot": {"n3_d4_fwd": "fast"}})
            assert choice.pinned() == {"embedding_update": {"tables2_plain": "fbgemm"}}
    finally:
        build.status.cache_clear()
    assert problems == [
        "kernel choice dot=fast at n3_d4_fwd is not one this version pins; ignored",
        "kernel embedding_update ran native at tables2_plain, which is unavailable here (native kernels: no C "
        "compiler: 'no-such-cc' is not on PATH (set CC to one)); using fbgemm, so this run will not repeat the "
        "one that recorded it exactly",
    ]


def test_pinning_outside_a_run_is_a_programming_error() -> None:
    with pytest.raises(RuntimeError, match=r"^kernel choices can only be pinned inside choice.run\(\)$"):
        choice.pin({})


def test_a_repeated_question_is_answered_without_reading_the_disk_again(tmp_path: Path) -> None:
    _record(tmp_path, "quant_pool", "b512_memo", "native")
    never = {"fbgemm": _never, "native": _never}
    assert choice.choose("quant_pool", "b512_memo", never) == "native"
    (choice.directory(tmp_path) / "quant_pool" / "b512_memo.json").unlink()
    choice._read.cache_clear()
    assert choice.choose("quant_pool", "b512_memo", never) == "native"


def test_the_memo_follows_the_environment_and_run_reads_the_disk_afresh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    _record(tmp_path, "lookup", "b8_memo", "concurrent")
    _record(other, "lookup", "b8_memo", "sequential")
    never = {"sequential": _never, "concurrent": _never}
    assert choice.choose("lookup", "b8_memo", never) == "concurrent"
    monkeypatch.setenv(choice.ENV, "lookup=sequential")
    assert choice.choose("lookup", "b8_memo", never) == "sequential"
    monkeypatch.delenv(choice.ENV)
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(other))
    assert choice.choose("lookup", "b8_memo", never) == "sequential"
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    assert choice.choose("lookup", "b8_memo", never) == "concurrent"
    (choice.directory(tmp_path) / "lookup" / "b8_memo.json").unlink()
    _record(tmp_path, "lookup", "b8_memo", "sequential")  # as if another process had measured anew
    with choice.run():
        assert choice.choose("lookup", "b8_memo", never) == "sequential"


def test_pins_win_over_the_memo_in_a_run(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    _record(tmp_path, "dot", f"n5_memo_t{threads}", "torch", site="n5_memo")
    never = {"torch": _never, "native": _never}
    with choice.run():
        assert choice.choose("dot", "b64_n5_memo", never, site="n5_memo") == "torch"
    with choice.run():
        choice.pin({"dot": {"n5_memo": "native"}})
        assert choice.choose("dot", "b64_n5_memo", never, site="n5_memo") == "native"


def test_used_names_only_what_this_process_ran(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(choice, "_used", {})
    monkeypatch.setattr(choice, "_forced_used", {})
    _record(tmp_path, "lookup", "b16_used", "concurrent")
    _record(tmp_path, "lookup", "b32_unused", "sequential")
    assert choice.choose("lookup", "b16_used", {"sequential": _never, "concurrent": _never}) == "concurrent"
    monkeypatch.setenv(choice.ENV, "dot=torch")
    assert choice.choose("dot", "b1", {"torch": _never, "native": _never}) == "torch"
    assert choice.machine()["kernels"] == {"dot": {"*": "torch"}, "lookup": {"b16_used": "concurrent"}}
    assert choice.used() == {"dot": {"*": "torch"}, "lookup": {"b16_used": "concurrent"}}
    assert choice.active() == {"dot": {"*": "torch"}, "lookup": {"b16_used": "concurrent", "b32_unused": "sequential"}}
