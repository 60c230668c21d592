"""Hostile input, round 3: the commands added since round 2 (`data prepare`, `data split`, `export` of
sequence and retrieval models, `retrieve`, `info`) and the numbers a user types.

Each case is a row of a table: the command line, the exit status and the exact last line of stderr;
no case may end in a traceback, a kill or a half-written output. Commands run in-process (the CLI's
`main`), sharing one module fixture: a tiny HSTU next-item model and a tiny DLRM, trained a few steps
and exported. A full disk and a read-only file system are tmpfs mounts (this machine's tests run as
root; where mounting is not permitted those cases skip, saying so).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

import compiler.serving.export as serving_export
import runtime.data.movielens.split as movielens_split
import runtime.serving.retrieve as serving_retrieve
from compiler.cli import main
from compiler.commands.train_launch import Terminated
from runtime.checkpoint import dcp
from runtime.cpu import choice
from runtime.data.errors import DataError, RowError
from runtime.data.movielens.reader import parse_rating
from runtime.data.prepared.manifest import read_manifest
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.train.limits import MAX_BATCH_SIZE, MAX_SEED
from runtime.train.worker import load_module

REPO = Path(__file__).resolve().parents[3]
SEQUENCES = 40
HSTU_SPEC = """\
version: 1
name: tiny_hstu
features:
  sparse:
    - {{name: history, table: item, pooling: none, max_length: 8}}
  timestamps:
    - {{name: history_time, sequence: history}}
tables:
  - {{name: item, num_embeddings: 40, dim: 8, init: {{min: -0.5, max: 0.5}}}}
model:
  encoder: {{type: hstu, input: sparse.history, timestamps: timestamps.history_time, num_layers: 1, num_heads: 1,
            attention_dim: 8, linear_dim: 8, num_buckets: 8}}
heads:
  - {{name: next_item, loss: sampled_softmax, input: encoder, item: sparse.history, negatives: {{uniform: 8}},
     temperature: 0.1, normalize: true}}
training:
  batch_size: 8
  dense_optimizer: {{type: adam, lr: 0.01}}
  sparse_optimizer: {{type: rowwise_adagrad, lr: 0.05}}
data:
  reader: csv
  path: {data}
  columns: {{h: history, t: history_time}}
"""
DLRM_SPEC = """\
version: 1
name: tiny_dlrm
features:
  dense:
    - {name: int, size: 4}
  sparse:
    - {name: a, num_embeddings: 50, dim: 8}
    - {name: b, num_embeddings: 40, dim: 8}
model:
  bottom: {type: mlp, input: dense.int, layers: [16, 8]}
  interaction: {type: dot, input: [bottom, sparse.*]}
  top: {type: mlp, input: [bottom, interaction], layers: [16, 1]}
heads:
  - {name: click, input: top, loss: bce}
training:
  batch_size: 16
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """(exit status, stdout, the last line of stderr) of `reccompile ARGV`, checked for tracebacks."""
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    return code, out, lines[-1] if lines else ""


def sequences_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("h,t\n" + "".join(f"{ids},{times}\n" for ids, times in rows))
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile3")
    lengths = [2 + s % 5 for s in range(SEQUENCES)]  # histories of 2 to 6 items, each with its times
    rows = [
        ("|".join(str(1 + (7 * s + 3 * j) % 39) for j in range(n)), "|".join(str(1000 + 10 * j) for j in range(n)))
        for s, n in enumerate(lengths)
    ]
    sequences_csv(root / "seqs.csv", rows)
    (root / "hstu.yaml").write_text(HSTU_SPEC.format(data=root / "seqs.csv"))
    (root / "dlrm.yaml").write_text(DLRM_SPEC)
    (root / "ratings.dat").write_text(
        "".join(f"{u}::{1 + (u * 7 + t * 3) % 300}::5::{1000 + u * 100 + t}\n" for u in range(1, 30) for t in range(6))
    )
    for name in ("hstu", "dlrm"):
        assert (
            main(
                [
                    "train",
                    str(root / f"{name}.yaml"),
                    "--steps",
                    "2",
                    "--checkpoint-dir",
                    str(root / f"{name}_ck"),
                    "-o",
                    str(root / f"{name}_build"),
                ]
            )
            == 0
        )
        assert (
            main(
                [
                    "export",
                    str(root / f"{name}.yaml"),
                    "--checkpoint",
                    str(root / f"{name}_ck"),
                    "--no-aot",
                    "-o",
                    str(root / f"{name}_out"),
                ]
            )
            == 0
        )
    return root


# -- numbers a user types: refused with the flag and its range, before anything is sized by them --

USAGE = [
    (
        ["train", "{dlrm}", "--batch-size", 10**12],
        "error: --batch-size must be between 1 and 2,147,483,647, got 1000000000000",
    ),
    (
        ["train", "{dlrm}", "--batch-size", 2**63],
        f"error: --batch-size must be between 1 and 2,147,483,647, got {2**63}",
    ),
    (
        ["train", "{dlrm}", "--seed", 2**70],
        "error: --seed must be between 0 and 9,223,372,036,854,775,807, got 1180591620717411303424",
    ),
    (["train", "{dlrm}", "--seed", -1], "error: --seed must be between 0 and 9,223,372,036,854,775,807, got -1"),
    (["train", "{dlrm}", "--threads", 10**11], "error: --threads must be between 1 and 4,096, got 100000000000"),
    (["train", "{dlrm}", "--data-workers", 10**9], "error: --data-workers must be between 0 and 64, got 1000000000"),
    (
        ["train", "{dlrm}", "--pipeline-depth", 10**9],
        "error: --pipeline-depth must be between 1 and 64, got 1000000000",
    ),
    (["train", "{dlrm}", "--nproc", 10**6], "error: --nproc must be between 1 and 1,024, got 1000000"),
    (
        ["plan", "{dlrm}", "--world-size", 10**9],
        "reccompile plan: error: argument --world-size: must be between 1 and 65,536, got 1000000000",
    ),
    (
        ["data", "prepare", "{dlrm}", "--data", "criteo:x", "-o", "{tmp}/p", "--workers", 10**5],
        "error: --workers must be between 0 and 64, got 100000",
    ),
    (
        ["retrieve", "{hstu_out}", "--batch-size", 2**31, "-o", "{tmp}/r.csv"],
        "reccompile retrieve: error: argument --batch-size: must be between 1 and 2,147,483,647, got 2147483648",
    ),
    (
        ["retrieve", "{hstu_out}", "--k", 0, "-o", "{tmp}/r.csv"],
        "reccompile retrieve: error: argument --k: must be at least 1, got 0",
    ),
    (
        ["predict", "{dlrm_out}", "--seed", 2**64, "-o", "{tmp}/p.csv"],
        f"reccompile predict: error: argument --seed: must be between 0 and 9,223,372,036,854,775,807, got {2**64}",
    ),
    (
        ["predict", "{dlrm_out}", "--threads", 2**40, "-o", "{tmp}/p.csv"],
        f"reccompile predict: error: argument --threads: must be between 1 and 4,096, got {2**40}",
    ),
]


def _fill(argv: list[object], work: Path, tmp: Path) -> list[str]:
    names = {
        "dlrm": work / "dlrm.yaml",
        "hstu": work / "hstu.yaml",
        "hstu_out": work / "hstu_out",
        "dlrm_out": work / "dlrm_out",
        "tmp": tmp,
        "work": work,
    }
    return [str(arg).format(**names) for arg in argv]


@pytest.mark.parametrize("argv, said", USAGE)
def test_a_number_past_its_range_is_refused_naming_the_flag_and_the_range(
    work: Path, tmp_path: Path, capsys, argv: list[object], said: str
) -> None:
    assert run(capsys, *_fill(argv, work, tmp_path))[::2] == (2, said)
    assert list(tmp_path.iterdir()) == []


def test_check_refuses_a_spec_batch_size_or_seed_past_the_bounds(work: Path, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "huge.yaml"
    spec.write_text(DLRM_SPEC.replace("batch_size: 16", f"batch_size: {10**12}\n  seed: {2**63}"))
    code = main(["check", str(spec)])
    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{spec}:16:15: error: training.batch_size: must be <= 2147483647 (got 1000000000000)",
        f"{spec}:17:9: error: training.seed: must be <= 9223372036854775807 (got 9223372036854775808)",
        "2 errors",
    ]


# -- retrieve: k bounded by the catalogue, timestamps taken as times --


def test_retrieve_clamps_k_to_the_catalogue_with_a_note(work: Path, tmp_path: Path, capsys) -> None:
    code, out, said = run(capsys, "retrieve", work / "hstu_out", "--rows", 3, "--k", 10**8, "-o", tmp_path / "r.csv")
    items = json.loads((work / "hstu_out" / "manifest.json").read_text())["retrieval"]["items"]
    assert (code, said) == (
        0,
        f"note: --k 100,000,000 is more than the {items} items of the index: retrieving all {items}",
    )
    assert out.startswith(f"wrote the top {items} of {items} items (")
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 1 + 3 * items


def test_retrieve_takes_the_largest_timestamps_and_refuses_ones_past_64_bits(
    work: Path, tmp_path: Path, capsys
) -> None:
    largest = sequences_csv(tmp_path / "largest.csv", [("1|2|3", f"{2**63 - 3}|{2**63 - 2}|{2**63 - 1}")])
    code, out, _ = run(capsys, "retrieve", work / "hstu_out", "--data", f"csv:{largest}", "-o", tmp_path / "a.csv")
    assert code == 0 and out.startswith("wrote the top 10 of ")
    assert len((tmp_path / "a.csv").read_text().splitlines()) == 1 + 10
    past = sequences_csv(tmp_path / "past.csv", [("1|2", "5|6"), ("1|2", f"5|{10**20}")])
    assert run(capsys, "retrieve", work / "hstu_out", "--data", f"csv:{past}", "-o", tmp_path / "b.csv")[::2] == (
        1,
        f"error: {past}:3: column t: a time outside the 64-bit integers (value '100000000000000000000'); "
        "pass --bad-rows skip to count and skip bad rows instead",
    )
    assert not (tmp_path / "b.csv").exists()


@pytest.mark.parametrize(
    "line, column",
    [
        (b"1::20::4::100000000000000000000", "timestamp"),
        (b"99999999999999999999::20::4::5", "userId"),
        (b"1::9223372036854775808::4::5", "movieId"),
    ],
)
def test_a_movielens_number_past_64_bits_is_a_bad_row_naming_its_column(line: bytes, column: str) -> None:
    with pytest.raises(RowError) as refused:
        parse_rating(line, b"::")
    assert (str(refused.value), refused.value.column) == (f"column {column}: past the 64-bit integers", column)
    assert parse_rating(b"1::2::4::9223372036854775807", b"::") == (1, 2, 4.0, 2**63 - 1)  # the largest is a time


# -- data paths that are no file or directory of data --


@pytest.mark.parametrize(
    "argv",
    [
        ["data", "prepare", "{dlrm}", "--data", "criteo:/dev/null", "-o", "{tmp}/p"],
        ["data", "prepare", "{hstu}", "--data", "csv:/dev/null", "-o", "{tmp}/p"],
        ["retrieve", "{hstu_out}", "--data", "csv:/dev/null", "-o", "{tmp}/r.csv"],
    ],
)
def test_data_that_is_no_file_or_directory_is_one_line_naming_it(work: Path, tmp_path: Path, capsys, argv) -> None:
    said = "error: /dev/null: not a regular file or a directory of data files"
    assert run(capsys, *_fill(argv, work, tmp_path))[::2] == (1, said)
    assert list(tmp_path.iterdir()) == []


# -- training that has nothing to learn from --


@pytest.mark.parametrize("rows", [[("", "")] * 4, [("3", "10"), ("5", "11")]], ids=["empty", "one_item_each"])
def test_a_next_item_run_without_a_pair_to_learn_from_is_an_error_naming_the_feature(
    work: Path, tmp_path: Path, capsys, rows
) -> None:
    data = sequences_csv(tmp_path / "short.csv", rows)
    code, _, said = run(
        capsys, "train", work / "hstu.yaml", "--data", f"csv:{data}", "--steps", 2, "-o", tmp_path / "b"
    )
    assert (code, said) == (
        1,
        "error: rank 0: head 'next_item': nothing to learn from in 2 steps: no sample of feature 'history' has a "
        "positive (a next-item history needs 2 items or more; a two-tower sample one item)",
    )


def test_the_compiled_model_refuses_timestamps_whose_lengths_differ_from_their_ids(work: Path) -> None:
    module = load_module(str(work / "hstu_build" / "tiny_hstu.py"))
    model = module.build().eval()
    sparse = KeyedJaggedTensor.from_lengths_sync(
        ["history", "history_time"], torch.tensor([4, 5, 6, 7, 10, 11, 12]), torch.tensor([2, 2, 1, 2])
    )
    with pytest.raises(ValueError) as refused, torch.no_grad():
        model({}, sparse)
    assert (
        str(refused.value) == "pad_times: sample 0 has 1 timestamps but 2 ids in its sequence; each id needs its time"
    )


# -- a prepared folder: two prepares at once, edited or damaged by hand --


def test_a_second_prepare_into_one_folder_is_refused_while_the_first_runs(work: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "prep"
    lock = out / ".prepare.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from runtime.storage.lock import FileLock; "
            "FileLock(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()",
            str(lock),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        said = run(capsys, "data", "prepare", work / "hstu.yaml", "--data", f"csv:{work / 'seqs.csv'}", "-o", out)
        assert said[::2] == (
            1,
            f"error: {out} is in use by another prepare (pid {holder.pid}, lock {lock}); "
            "wait for it to end or choose another -o",
        )
    finally:
        holder.communicate("")
    assert sorted(p.name for p in out.iterdir()) == [".prepare.lock"]  # the holder's: nothing of the refused run
    code, out_text, _ = run(
        capsys, "data", "prepare", work / "hstu.yaml", "--data", f"csv:{work / 'seqs.csv'}", "-o", out
    )
    assert code == 0 and out_text.splitlines()[-1].startswith(f"prepared {SEQUENCES} rows")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "part-00000.parquet"]  # the lock went too


@pytest.fixture(scope="module")
def prepared(work: Path) -> Path:
    out = work / "prepared"
    assert main(["data", "prepare", str(work / "hstu.yaml"), "--data", f"csv:{work / 'seqs.csv'}", "-o", str(out)]) == 0
    return out


def _edited(prepared: Path, tmp_path: Path, edit: Callable[[dict], object]) -> Path:
    copy = tmp_path / "edited"
    copy.mkdir()
    for path in prepared.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    data = json.loads((copy / "manifest.json").read_text())
    edited = edit(data)
    (copy / "manifest.json").write_bytes(edited if isinstance(edited, bytes) else json.dumps(edited).encode())
    return copy


def _set(data: dict, **values: object) -> dict:
    data.update(values)
    return data


EDITS = [
    (lambda d: [], "(TypeError: a JSON list, not an object)"),
    (
        lambda d: b"\x00\xff" * 40,
        "(UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 1: invalid start byte)",
    ),
    (lambda d: _set(d, row_group_rows=0), "(ValueError: row_group_rows is 0, must be at least 1)"),
    (lambda d: _set(d, rows=-5), f"(ValueError: rows -5 are not the sum of the row groups' ({SEQUENCES}))"),
    (
        lambda d: _set(d, files=[{**d["files"][0], "name": "../seqs.csv"}]),
        "(ValueError: part name '../seqs.csv' is not a file of the directory)",
    ),
    (
        lambda d: _set(d, files=[{**d["files"][0], "row_groups": [10**12]}]),
        "(ValueError: a row group's rows are outside 1 to row_group_rows 512)",
    ),
]


@pytest.mark.parametrize("edit, said", EDITS)
def test_a_prepared_manifest_edited_by_hand_is_one_line_naming_it(prepared: Path, tmp_path: Path, edit, said) -> None:
    copy = _edited(prepared, tmp_path, edit)
    with pytest.raises(DataError) as refused:
        read_manifest(copy)
    assert str(refused.value) == f"{copy / 'manifest.json'}: not a readable manifest {said}"


def test_a_prepare_run_again_over_a_part_truncated_by_hand_says_so(
    work: Path, prepared: Path, tmp_path: Path, capsys
) -> None:
    copy = _edited(prepared, tmp_path, lambda d: d)
    with open(copy / "part-00000.parquet", "r+b") as part:
        part.truncate(100)
    expected = json.loads((copy / "manifest.json").read_text())["files"][0]["bytes"]
    assert run(capsys, "data", "prepare", work / "hstu.yaml", "--data", f"csv:{work / 'seqs.csv'}", "-o", copy)[
        ::2
    ] == (1, f"error: prepared data {copy}: part part-00000.parquet has 100 bytes, the manifest says {expected}")


def test_a_prepare_run_again_over_a_manifest_whose_identity_was_edited_refuses_it(
    work: Path, prepared: Path, tmp_path: Path, capsys
) -> None:
    spec_sha256 = json.loads((prepared / "manifest.json").read_text())["source"]["identity"]["spec_sha256"]
    copy = _edited(prepared, tmp_path, lambda d: _set(d, source={**d["source"], "identity": ["edited"]}))
    said = run(capsys, "data", "prepare", work / "hstu.yaml", "--data", f"csv:{work / 'seqs.csv'}", "-o", copy)
    assert said[::2] == (
        1,
        f"error: {copy}: already holds prepared data with spec_sha256 None (this prepare's: {spec_sha256!r}); "
        "choose another -o",
    )


@pytest.mark.parametrize(
    "journal, said",
    [
        (b"\x9a\xff junk", "not JSON: 'utf-8' codec can't decode byte 0x9a in position 0: invalid start byte"),
        (b'{"identity": {"spec', "not JSON: Unterminated string starting at: line 1 column 15 (char 14)"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"identity": {}}', "KeyError: 'parts'"),
    ],
)
def test_a_stopped_prepares_journal_damaged_by_hand_is_one_line(
    work: Path, tmp_path: Path, capsys, journal, said
) -> None:
    out = tmp_path / "prep"
    out.mkdir()
    (out / ".prepare.json").write_bytes(journal)
    assert run(capsys, "data", "prepare", work / "hstu.yaml", "--data", f"csv:{work / 'seqs.csv'}", "-o", out)[::2] == (
        1,
        f"error: {out / '.prepare.json'}: the journal of a stopped prepare is damaged ({said}); remove the directory",
    )


# -- the kernel-choice cache with garbage in it --


def test_info_lists_the_choices_it_can_read_past_garbage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setattr(choice, "cache_root", lambda: tmp_path)
    folder = choice.directory() / "dot"
    folder.mkdir(parents=True)
    (folder / "b512.json").write_bytes(b"\xef\x9a\x00 random bytes")
    (folder / "b1024.json").write_text(json.dumps({"winner": "native", "times_ms": {"torch": 2.0, "native": 1.0}}))
    code, out, _ = run(capsys, "info")
    assert code == 0
    assert (
        "  dot        b1024                                            native     (torch 2.00 ms, native 1.00 ms)"
        in (out.splitlines())
    )
    assert "b512" not in out


# -- a full disk and a read-only file system under -o: one line, nothing left behind --


def _mount(target: Path, options: str) -> bool:
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True).returncode
        == 0
    )


@pytest.fixture(scope="module")
def filesystems(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """{'full': a tmpfs filled to the last byte (a file .filler), 'read-only': an empty read-only tmpfs}."""
    root = tmp_path_factory.mktemp("filesystems")
    full, read_only = root / "full", root / "read-only"
    full.mkdir()
    read_only.mkdir()
    if not _mount(full, "size=64k"):
        pytest.skip("mounting a tmpfs is not permitted here (the tests do not run as root)")
    fd = os.open(full / ".filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    assert _mount(read_only, "size=64k,ro")
    try:
        yield {"full": full, "read-only": read_only}
    finally:
        for target in (full, read_only):
            subprocess.run(["umount", "--lazy", str(target)], check=True)


CAUSES = {"full": "No space left on device", "read-only": "Read-only file system"}
OUTPUTS = [
    (
        "data_prepare",
        ["data", "prepare", "{hstu}", "--data", "csv:{work}/seqs.csv", "-o", "{dir}/prep"],
        "cannot write {dir}/prep: {cause}; once it can be written, run the same command again to continue",
    ),
    (
        "export",
        ["export", "{hstu}", "--checkpoint", "{work}/hstu_ck", "--no-aot", "-o", "{dir}/exp"],
        "cannot write {dir}/exp: {cause}",
    ),
    ("predict", ["predict", "{dlrm_out}", "--rows", 512, "-o", "{dir}/p.csv"], "cannot write {dir}/p.csv: {cause}"),
    ("retrieve", ["retrieve", "{hstu_out}", "--rows", 64, "-o", "{dir}/r.csv"], "cannot write {dir}/r.csv: {cause}"),
    ("train", ["train", "{dlrm}", "--steps", 1, "-o", "{dir}/build"], "cannot write {dir}/build{file}: {cause}"),
    (
        "data_split",
        ["data", "split", "--data", "movielens:{work}/ratings.dat", "-o", "{dir}/split"],
        "cannot write {dir}/split: {cause}",
    ),
]


@pytest.mark.parametrize("kind", ["full", "read-only"])
@pytest.mark.parametrize("name, argv, said", OUTPUTS, ids=[case[0] for case in OUTPUTS])
def test_an_output_on_a_full_or_read_only_file_system_is_one_line_and_leaves_nothing(
    work: Path, filesystems: dict[str, Path], capsys, kind: str, name: str, argv: list[object], said: str
) -> None:
    where = filesystems[kind]
    before = sorted(os.listdir(where))
    names = {
        "dir": where,
        "cause": CAUSES[kind],
        "work": work,
        "hstu": work / "hstu.yaml",
        "dlrm": work / "dlrm.yaml",
        "hstu_out": work / "hstu_out",
        "dlrm_out": work / "dlrm_out",
        # the folder is made on a full tmpfs (no data pages), then its first file cannot be written
        "file": "/tiny_dlrm.py" if kind == "full" else "",
    }
    command = [str(arg).format(**names) for arg in argv]
    assert run(capsys, *command)[::2] == (1, "error: " + said.format(**names))
    assert sorted(os.listdir(where)) == before


def test_the_schema_states_the_bounds_the_flags_check() -> None:
    training = json.loads((REPO / "compiler" / "spec" / "schema.json").read_text())["$defs"]["training"]["properties"]
    assert (training["batch_size"]["maximum"], training["seed"]["maximum"]) == (MAX_BATCH_SIZE, MAX_SEED)


# -- Ctrl-C halfway through writing: one line, status 130, nothing written --


def _interrupted_after(real: Callable) -> Callable:
    def write_then_stop(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    return write_then_stop


@pytest.mark.parametrize(
    "target, name, argv",
    [
        (serving_retrieve, "retrieve", ["retrieve", "{hstu_out}", "--rows", 4, "-o", "{tmp}/out/r.csv"]),
        (
            serving_export,
            "export_items",
            ["export", "{hstu}", "--checkpoint", "{work}/hstu_ck", "--no-aot", "-o", "{tmp}/out/exp"],
        ),
        (
            movielens_split.shutil,
            "copyfile",  # train/ and test/ written, then the movies files
            ["data", "split", "--data", "movielens:{tmp}/ml/ratings.dat", "-o", "{tmp}/out/split"],
        ),
    ],
    ids=["retrieve", "export", "data_split"],
)
def test_ctrl_c_halfway_through_writing_leaves_nothing_and_says_so(
    work: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, target: object, name: str, argv: list[object]
) -> None:
    (tmp_path / "ml").mkdir()
    (tmp_path / "ml" / "ratings.dat").write_bytes((work / "ratings.dat").read_bytes())
    (tmp_path / "ml" / "movies.dat").write_text("1::Toy Story (1995)::Animation\n")
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(target, name, _interrupted_after(getattr(target, name)))
    assert run(capsys, *_fill(argv, work, tmp_path))[::2] == (130, "interrupted: nothing was written")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_a_stop_during_a_checkpoint_save_is_the_stop_not_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: type[KeyboardInterrupt]
) -> None:
    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr(FileSystemWriter, "write_data", stopped)
    with pytest.raises(stop):
        dcp.save({"w": torch.ones(3)}, tmp_path / "ck", None)


def test_an_export_that_loses_the_race_for_its_output_leaves_no_staging(
    work: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def raced(outdir: Path, staging: Path) -> None:  # another export renamed OUT between our two renames
        raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), str(outdir))

    monkeypatch.setattr(serving_export, "_replace", raced)
    out = tmp_path / "exp"
    argv = ["export", work / "hstu.yaml", "--checkpoint", work / "hstu_ck", "--no-aot", "-o", out]
    assert run(capsys, *argv)[::2] == (1, f"error: cannot write {out}: Directory not empty")
    assert list(tmp_path.iterdir()) == []


def test_a_next_item_exports_recall_check_on_a_csv_says_what_it_reads(work: Path, tmp_path: Path, capsys) -> None:
    argv = [
        "export",
        work / "hstu.yaml",
        "--checkpoint",
        work / "hstu_ck",
        "--no-aot",
        "-o",
        tmp_path / "exp",
        "--eval-data",
        f"csv:{work / 'seqs.csv'}",
    ]
    assert run(capsys, *argv)[::2] == (
        1,
        f"error: csv:{work / 'seqs.csv'}: the recall check of a next-item model reads MovieLens ratings (movielens:FILE)",
    )
    assert list(tmp_path.iterdir()) == []
