"""runtime/data/prepared/prepare.py: raw rows parsed once into Parquet parts, a manifest, refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from sample_files import criteo_lines, criteo_spec, write_lines

import runtime.data.prepared.prepare as prepare_module
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.errors import DataError
from runtime.data.loader import epoch_batches
from runtime.data.prepared.manifest import file_sha256, read_manifest, write_json_atomically
from runtime.data.prepared.prepare import PrepareSettings, prepare
from runtime.data.prepared.reading import RowReader, open_prepared
from runtime.data.sources import DataChoice, open_reader

SETTINGS = PrepareSettings(row_group_rows=16, part_row_groups=3, workers=0, block_lines=50)


@pytest.fixture
def criteo(tmp_path: Path) -> Path:
    lines = criteo_lines(300)
    lines[7] = "1\tnot a criteo line"
    lines[120] = lines[120].replace("\t", "\tx", 1)  # I1 "x..." is not an integer
    return write_lines(tmp_path / "day_0", lines)


def test_prepared_rows_are_the_readers_good_rows_in_file_order(criteo: Path, tmp_path: Path) -> None:
    inputs = criteo_spec(rows=1000)
    manifest = prepare(inputs, DataChoice("criteo", str(criteo)), tmp_path / "out", SETTINGS)
    assert manifest.rows == 298
    assert [part.rows for part in manifest.files] == [48] * 6 + [10]
    assert manifest.files[-1].row_groups == (10,) and manifest.files[0].row_groups == (16, 16, 16)
    reader = open_reader(inputs, DataChoice("criteo", str(criteo)))
    (expected,) = [
        b.batch
        for b in epoch_batches(
            reader, global_batch=298, rank=0, world_size=1, bad_rows=BadRowLog("skip"), num_workers=0
        )
    ]
    got = RowReader(open_prepared(inputs, tmp_path / "out")).read(0, 298).to_batch(False)
    assert torch.equal(got.dense["int"], expected.dense["int"])
    assert torch.equal(got.labels["click"], expected.labels["click"])
    assert torch.equal(got.sparse.values(), expected.sparse.values())
    assert torch.equal(got.sparse.lengths(), expected.sparse.lengths())


def test_the_manifest_names_bad_rows_stats_and_file_hashes(criteo: Path, tmp_path: Path) -> None:
    prepare(criteo_spec(rows=1000), DataChoice("criteo", str(criteo)), tmp_path / "out", SETTINGS)
    manifest = read_manifest(tmp_path / "out")
    assert manifest.source["lines"] == 300 and manifest.source["bad_rows"] == 2
    assert manifest.source["bad_examples"] == [
        f"{criteo}:8: 2 tab-separated fields, expected 40 (label, I1..I13, C1..C26) (value '1\\tnot a criteo line')",
        f"{criteo}:121: column I1: not an integer of at most 18 digits (value 'x{criteo_lines(300)[120].split(chr(9))[1]}')",
    ]
    cat = manifest.columns["sparse.cat_0"]
    assert cat["spec"] == {"kind": "sparse", "table_rows": 1000}
    assert cat["stats"]["rows"] == 298 and cat["stats"]["values"] == 298 and cat["stats"]["nulls"] == 0
    assert 0 <= cat["stats"]["min"] <= cat["stats"]["max"] < 1000
    label = manifest.columns["label.click"]["stats"]
    assert (label["min"], label["max"]) == (0.0, 1.0)
    for part in manifest.files:
        assert file_sha256(tmp_path / "out" / part.name) == part.sha256


def test_a_directory_without_a_manifest_is_not_data(criteo: Path, tmp_path: Path) -> None:
    prepare(criteo_spec(rows=1000), DataChoice("criteo", str(criteo)), tmp_path / "out", SETTINGS)
    (tmp_path / "out" / "manifest.json").unlink()
    with pytest.raises(DataError) as error:
        open_prepared(criteo_spec(rows=1000), tmp_path / "out")
    assert str(error.value) == (
        f"prepared data {tmp_path / 'out'}: no manifest.json, so not a finished prepare (one still running or "
        f"stopped); run `reccompile data prepare` with -o {tmp_path / 'out'} again to finish it"
    )


def test_data_prepared_for_another_spec_is_refused_naming_the_column(criteo: Path, tmp_path: Path) -> None:
    prepare(criteo_spec(rows=1000), DataChoice("criteo", str(criteo)), tmp_path / "out", SETTINGS)
    bigger = criteo_spec(rows=2000)
    with pytest.raises(DataError) as error:
        open_prepared(bigger, tmp_path / "out")
    assert str(error.value) == (
        f"prepared data {tmp_path / 'out'}: column 'sparse.cat_0' was prepared with table_rows 1000 but the "
        "spec's sparse feature 'cat_0' has table_rows 2000; prepare the data again for this spec"
    )
    renamed = dataclasses.replace(bigger, heads=(dataclasses.replace(bigger.heads[0], label="ctr"),))
    with pytest.raises(DataError, match=r"no column 'label.ctr', which the spec's head label 'ctr' reads"):
        open_prepared(dataclasses.replace(renamed, sparse=criteo_spec(rows=1000).sparse), tmp_path / "out")
    with pytest.raises(DataError) as again:
        prepare(bigger, DataChoice("criteo", str(criteo)), tmp_path / "out", SETTINGS)
    digest = json.loads((tmp_path / "out" / "manifest.json").read_text())["spec_sha256"]
    assert str(again.value).startswith(f"{tmp_path / 'out'}: already holds prepared data with spec_sha256 '{digest}'")


def test_a_stopped_prepare_keeps_its_parts_and_continues(criteo: Path, tmp_path: Path, monkeypatch) -> None:
    inputs, choice = criteo_spec(rows=1000), DataChoice("criteo", str(criteo))
    whole = prepare(inputs, choice, tmp_path / "whole", SETTINGS)
    out = tmp_path / "out"

    class Stop(Exception):
        pass

    def journal_then_stop(path: Path, data: dict) -> None:
        write_json_atomically(path, data)
        if len(data["parts"]) == 2:
            raise Stop

    monkeypatch.setattr(prepare_module, "write_json_atomically", journal_then_stop)
    with pytest.raises(Stop):
        prepare(inputs, choice, out, SETTINGS)
    monkeypatch.undo()
    (out / ".part-00002.parquet.tmp").write_bytes(b"half a part")
    said: list[str] = []
    resumed = prepare(inputs, choice, out, SETTINGS, report=said.append)
    # parts of 48 rows, blocks of 50 lines: part 2 ends inside the second block (lines 51..100)
    assert said[0] == "resuming a stopped prepare: 2 parts (96 rows) kept, reading on from line 51 of the data"
    assert [p.sha256 for p in resumed.files] == [p.sha256 for p in whole.files]
    assert resumed.source["bad_rows"] == 2 and resumed.columns == whole.columns
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *(p.name for p in whole.files)]


@pytest.fixture
def days(tmp_path: Path) -> Path:
    """Three Criteo day files; the second has a bad line 31, the third is gzipped."""
    second = criteo_lines(110, seed=2)
    second[30] = "1\tnot a criteo line"
    write_lines(tmp_path / "days" / "day_0", criteo_lines(100, seed=1))
    write_lines(tmp_path / "days" / "day_1", second)
    write_lines(tmp_path / "days" / "day_2.gz", criteo_lines(90, seed=3), gzipped=True)
    return tmp_path / "days"


def _digests(root: Path) -> dict[str, str]:
    return {path.name: file_sha256(path) for path in sorted(root.iterdir())}


def test_one_process_per_file_writes_the_bytes_of_one_process(days: Path, tmp_path: Path) -> None:
    inputs, choice = criteo_spec(rows=1000), DataChoice("criteo", str(days))
    one = prepare(inputs, choice, tmp_path / "one", SETTINGS)
    by_file = prepare(inputs, choice, tmp_path / "by_file", dataclasses.replace(SETTINGS, workers=2))
    assert by_file.rows == one.rows == 299 and [p.rows for p in by_file.files] == [48] * 6 + [11]
    assert _digests(tmp_path / "by_file") == _digests(tmp_path / "one")
    assert sorted(_digests(tmp_path / "by_file")) == ["manifest.json", *(p.name for p in one.files)]
    assert by_file.source["lines"] == 300 and by_file.source["bad_rows"] == 1
    assert by_file.source["bad_examples"] == [
        f"{days / 'day_1'}:31: 2 tab-separated fields, expected 40 (label, I1..I13, C1..C26) "
        "(value '1\\tnot a criteo line')"
    ]


def test_a_bad_row_under_fail_stops_a_prepare_by_file_naming_its_file_and_line(days: Path, tmp_path: Path) -> None:
    settings = dataclasses.replace(SETTINGS, workers=2, bad_rows="fail")
    with pytest.raises(DataError) as error:
        prepare(criteo_spec(rows=1000), DataChoice("criteo", str(days)), tmp_path / "out", settings)
    assert str(error.value).startswith(f"{days / 'day_1'}:31: 2 tab-separated fields, expected 40")


def test_a_stopped_prepare_by_file_keeps_its_parsed_files_and_continues(
    days: Path, tmp_path: Path, monkeypatch
) -> None:
    inputs, choice = criteo_spec(rows=1000), DataChoice("criteo", str(days))
    settings = dataclasses.replace(SETTINGS, workers=2)
    whole = prepare(inputs, choice, tmp_path / "whole", SETTINGS)
    out = tmp_path / "out"

    class Stop(Exception):
        pass

    def journal_then_stop(path: Path, data: dict) -> None:
        write_json_atomically(path, data)
        if len(data["parts"]) == 3:
            raise Stop

    monkeypatch.setattr(prepare_module, "write_json_atomically", journal_then_stop)
    with pytest.raises(Stop):
        prepare(inputs, choice, out, settings)
    monkeypatch.undo()
    journal = json.loads((out / ".prepare.json").read_text())
    # parts of 48 rows: the third ends at row 144, the 44th good row of day_1 (file index 1)
    assert (journal["by_file"], journal["file"], journal["drop"], journal["lines"]) == (True, 1, 44, 100)
    # day_0's rows are all in parts: its file part goes; day_1's (and day_2's, if parsed) stay
    records = {p.name: p.stat().st_mtime_ns for p in out.glob(".file-*.json") if p.name != ".file-00000.json"}
    assert ".file-00001.json" in records
    (out / ".file-00002.parquet.tmp").write_bytes(b"half a file part")
    said: list[str] = []
    kept: dict[str, int] = {}
    remove_before = prepare_module.FileParts.remove_before

    def note_then_remove(self, index: int) -> None:
        kept.update({p.name: p.stat().st_mtime_ns for p in out.glob(".file-*.json") if p.name in records})
        remove_before(self, index)

    monkeypatch.setattr(prepare_module.FileParts, "remove_before", note_then_remove)
    resumed = prepare(inputs, choice, out, settings, report=said.append)
    assert said[0] == "resuming a stopped prepare: 3 parts (144 rows) kept, reading on from file 2 of the data"
    assert kept == records  # the files parsed before the stop were not parsed again
    assert _digests(out) == _digests(tmp_path / "whole")
    assert resumed.source["bad_rows"] == 1 and resumed.columns == whole.columns


def test_a_prepare_stopped_by_file_is_not_continued_line_by_line(days: Path, tmp_path: Path, monkeypatch) -> None:
    inputs, choice = criteo_spec(rows=1000), DataChoice("criteo", str(days))

    def journal_then_stop(path: Path, data: dict) -> None:
        write_json_atomically(path, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "write_json_atomically", journal_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, choice, tmp_path / "out", dataclasses.replace(SETTINGS, workers=2))
    monkeypatch.undo()
    with pytest.raises(DataError) as error:
        prepare(inputs, choice, tmp_path / "out", SETTINGS)
    assert str(error.value) == (
        f"{tmp_path / 'out'}: holds a stopped prepare parsed one process per file (--workers 1 or more); "
        "run it again with --workers 1 or more to continue it, or remove the directory"
    )


def test_a_prepare_runs_torch_on_one_thread_and_gives_the_callers_back(
    criteo: Path, tmp_path: Path, monkeypatch
) -> None:
    threads: list[int] = []
    part_stats = prepare_module.part_stats

    def counted(*args):
        threads.append(torch.get_num_threads())
        return part_stats(*args)

    monkeypatch.setattr(prepare_module, "part_stats", counted)
    callers = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        prepare(criteo_spec(rows=1000), DataChoice("criteo", str(criteo)), tmp_path / "out", SETTINGS)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(callers)
    assert threads == [1] * 7


def test_a_stopped_prepare_is_not_continued_on_a_changed_input(days: Path, tmp_path: Path, monkeypatch) -> None:
    inputs, choice = criteo_spec(rows=1000), DataChoice("criteo", str(days))
    out = tmp_path / "out"

    def journal_then_stop(path: Path, data: dict) -> None:
        write_json_atomically(path, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "write_json_atomically", journal_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, choice, out, SETTINGS)
    monkeypatch.undo()
    write_lines(days / "day_3", criteo_lines(10, seed=4))
    with pytest.raises(DataError) as error:
        prepare(inputs, choice, out, SETTINGS)
    assert str(error.value) == (
        f"{out}: holds a stopped prepare, but {days / 'day_3'} is new; choose another -o, or remove the directory"
    )
    (days / "day_3").unlink()
    finished = prepare(inputs, choice, out, SETTINGS)
    recorded = [stamp["path"] for stamp in finished.source["inputs"]]
    assert recorded == [str(days / name) for name in ("day_0", "day_1", "day_2.gz")]
    (days / "day_1").unlink()
    with pytest.raises(DataError) as error:
        prepare(inputs, choice, out, SETTINGS)
    assert str(error.value) == (
        f"{out}: already holds prepared data, but {days / 'day_1'} is gone; choose another -o, or remove {out} to "
        "prepare it again"
    )
