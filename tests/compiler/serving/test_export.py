"""`reccompile export` and `reccompile predict` end to end: train -> checkpoint -> export -> predict.

A small two-head spec (a shared table with two features, a weighted mean
table, keys in another order than the tables') is trained for a few steps
with `reccompile train --checkpoint-dir`, exported at several precisions
and scored with `reccompile predict`. The reference is the training module
in eval mode with the checkpoint loaded by runtime.checkpoint.store.

Stated bounds on the scores (sigmoid of the click logit, the value head's
output) against that reference, on this model: fp32 exactly equal (same
kernels, same order of summation); int8 <= 2e-3; int4 (with fp16 and int8
tables) <= 3e-2; int8 tables with the dense blocks in bfloat16 <= 3e-2.
The per-value bounds of the tables themselves are tests/runtime/test_quant_embedding.py's.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from compiler.cli import main
from runtime.checkpoint.store import load_checkpoint
from runtime.cpu import choice
from runtime.serving.export_dir import ExportError, load
from runtime.serving.packed_mlp import PackedMLP
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.worker import load_module

REPO = Path(__file__).resolve().parents[3]
SPEC = """\
version: 1
name: small_rec
features:
  dense:
    - {name: num, size: 5}
  sparse:
    - {name: user, num_embeddings: 200, dim: 8}
    - {name: item, table: items}
    - {name: tags, table: tag_table, max_ids_per_sample: 4, weighted: true}
    - {name: hist, table: items, max_ids_per_sample: 3}
tables:
  - {name: items, num_embeddings: 150, dim: 8}
  - {name: tag_table, num_embeddings: 40, dim: 8, pooling: mean}
model:
  bottom: {type: mlp, input: dense.num, layers: [16, 8]}
  inter:  {type: dot, input: [bottom, sparse.*]}
  top:    {type: mlp, input: [bottom, inter], layers: [16, 1], final_activation: none}
  aux:    {type: mlp, input: [dense.num, sparse.tags], layers: [1], final_activation: none}
heads:
  - {name: click, input: top, loss: bce}
  - {name: value, input: aux, loss: mse, label: value}
training:
  batch_size: 64
  seed: 5
  dense_optimizer: {type: adagrad, lr: 0.05}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.05}
"""
EXPORTS = {
    "fp32": ["--quantize", "none"],
    "int8": ["--quantize", "int8"],
    "mixed": ["--per-table", "user=int4,items=fp16,tag_table=int8"],
    "bf16": ["--quantize", "int8", "--dense", "bf16"],
    "int8dense": ["--quantize", "int8", "--dense", "int8"],
}
# int8dense: 8-bit layer inputs round about as coarsely as bf16's 8-bit mantissa (run forced to int8)
BOUNDS = {"fp32": 0.0, "int8": 2e-3, "mixed": 3e-2, "bf16": 3e-2, "int8dense": 3e-2}
ROWS, BATCH, SEED = 150, 64, 11


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The spec, its training run and checkpoint, and one export per entry of EXPORTS."""
    root = tmp_path_factory.mktemp("export")
    (root / "small.yaml").write_text(SPEC)
    code = main(
        [
            "train",
            str(root / "small.yaml"),
            "--steps",
            "3",
            "--batch-size",
            "64",
            "--log-every",
            "3",
            "--checkpoint-dir",
            str(root / "ckpt"),
            "--checkpoint-every",
            "3",
            "-o",
            str(root / "build"),
        ]
    )
    assert code == 0
    for name, options in EXPORTS.items():
        code = main(
            ["export", str(root / "small.yaml"), "--checkpoint", str(root / "ckpt"), *options, "-o", str(root / name)]
        )
        assert code == 0
    return root


def reference_scores(work: Path) -> list[list[str]]:
    """The training module in eval mode, checkpoint loaded, on predict's synthetic batches."""
    module = load_module(str(work / "build" / "small_rec.py"))
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    load_checkpoint(work / "ckpt", model, optimizer, spec_sha256=module.SPEC_SHA256)
    model.eval()
    rows = []
    with torch.no_grad():
        for step, start in enumerate(range(0, ROWS, BATCH)):
            batch = module.synthetic_batch(min(BATCH, ROWS - start), step=step, seed=SEED)
            outputs = model(batch.dense, batch.sparse)
            scores = torch.stack([torch.sigmoid(outputs["click"]), outputs["value"]], dim=1)
            rows += [[str(start + i), *(f"{v:.9g}" for v in values)] for i, values in enumerate(scores.tolist())]
    return rows


def predicted(work: Path, export: str, capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    output = work / f"{export}.csv"
    code = main(
        [
            "predict",
            str(work / export),
            "--rows",
            str(ROWS),
            "--batch-size",
            str(BATCH),
            "--seed",
            str(SEED),
            "-o",
            str(output),
        ]
    )
    assert code == 0
    report = capsys.readouterr().out
    assert report.startswith(f"wrote {ROWS} predictions to {output} in ") and "rows/s" in report
    with open(output, newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows[0] == ["id", "click", "value"]
    return rows[1:]


def test_fp32_export_predicts_exactly_what_the_trained_model_scores(work: Path, capsys) -> None:
    assert predicted(work, "fp32", capsys) == reference_scores(work)


@pytest.mark.parametrize("export", ["int8", "mixed", "bf16", "int8dense"])
def test_quantized_exports_stay_within_the_stated_bounds(
    work: Path, export: str, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(choice.ENV, "mlp_int8=int8")  # the int8 layers, whatever this machine would choose
    expected = torch.tensor([[float(v) for v in row[1:]] for row in reference_scores(work)])
    actual = torch.tensor([[float(v) for v in row[1:]] for row in predicted(work, export, capsys)])
    assert 0 < float((actual - expected).abs().max()) <= BOUNDS[export]


def test_only_an_all_fp32_export_keeps_the_trained_models_arithmetic(work: Path) -> None:
    """Approximate exports' MLP layers may run packed wherever that is faster (runtime/serving/packed_mlp.py)."""
    cases = (("fp32", True, False), ("int8", False, False), ("mixed", False, False), ("int8dense", False, True))
    for export, exact, int8 in cases:
        _, model = load(work / export)
        packed = [module for module in model.modules() if isinstance(module, PackedMLP)]
        assert packed and all(module.exact is exact and module.int8 is int8 for module in packed), export


def test_a_loaded_export_builds_no_autograd_graph_without_no_grad(work: Path) -> None:
    """Served outputs and scores carry no grad_fn even outside torch.no_grad()."""
    module = load_module(str(work / "build" / "small_rec.py"))
    batch = module.synthetic_batch(8, step=0, seed=SEED)
    for export in ("fp32", "int8", "bf16"):
        _, model = load(work / export)
        outputs = model(batch.dense, batch.sparse)
        assert [(o.requires_grad, o.grad_fn) for o in outputs.values()] == [(False, None)] * 2, export
        scores = model.scores(outputs)
        assert [(s.requires_grad, s.grad_fn) for s in scores.values()] == [(False, None)] * 2, export


def test_the_manifest_lists_precision_and_size_on_disk_per_table(work: Path) -> None:
    manifest = json.loads((work / "mixed" / "manifest.json").read_text())
    tables = {t["name"]: t for t in manifest["tables"]}
    assert {name: (t["precision"], t["row_bytes"]) for name, t in tables.items()} == {
        "user": ("int4", 8),
        "items": ("fp16", 16),
        "tag_table": ("int8", 12),
    }
    for name, table in tables.items():
        assert table["bytes"] == (work / "mixed" / table["file"]).stat().st_size
        assert table["fp32_bytes"] == table["rows"] * table["dim"] * 4
    assert manifest["checkpoint"]["step"] == 3
    assert manifest["aot"]["sparse_keys"] == ["user", "item", "hist", "tags"]
    layout = json.loads((work / "mixed" / "layout.json").read_text())
    assert [t["name"] for t in layout["tables"]] == ["user", "items", "tag_table"]


def test_exported_module_and_program_load_without_the_compiler(work: Path) -> None:
    """A fresh interpreter: the .pt2 needs torch + fbgemm_gpu only, the module torch + runtime;
    the program serves any batch size, a single request and a batch without ids included."""
    script = textwrap.dedent(f"""
        import json, sys
        import torch, fbgemm_gpu
        directory = {str(work / "int8")!r}
        manifest = json.load(open(directory + "/manifest.json"))
        program = torch.export.load(directory + "/" + manifest["aot"]["file"]).module()
        torch.manual_seed(0)
        keys = manifest["aot"]["sparse_keys"]

        def inputs(batch):  # user and item: one id per sample; hist: 0-3; tags: 0-4, weighted
            one = torch.ones(2 * batch, dtype=torch.long)
            lengths = torch.cat([one, torch.randint(0, 4, (batch,)), torch.randint(0, 5, (batch,))])
            hist, tags = int(lengths[2 * batch:3 * batch].sum()), int(lengths[3 * batch:].sum())
            values = torch.cat([
                torch.randint(0, 200, (batch,)), torch.randint(0, 150, (batch + hist,)), torch.randint(0, 40, (tags,)),
            ])
            return {{"num": torch.randn(batch, 5)}}, values, lengths, torch.rand(values.numel())

        no_ids = ({{"num": torch.randn(3, 5)}}, torch.zeros(0, dtype=torch.long), torch.zeros(12, dtype=torch.long),
                  torch.zeros(0))
        cases = {{"7": inputs(7), "1": inputs(1), "no ids": no_ids}}
        scores = {{name: (args, program(*args)) for name, args in cases.items()}}
        no_runtime = not any(name == "runtime" or name.startswith("runtime.") for name in sys.modules)
        import runtime.serving.export_dir
        from runtime.sparse.jagged import KeyedJaggedTensor
        module, model = runtime.serving.export_dir.load(directory)
        same = {{}}
        for name, ((dense, values, lengths, weights), aot) in scores.items():
            with torch.no_grad():
                eager = model(dense, KeyedJaggedTensor(keys, values, weights, lengths=lengths))
            # eager CPU linears run on oneDNN, the exported program's on aten.linear
            same[name] = all(torch.allclose(aot[head], eager[head], rtol=1e-5, atol=1e-6) for head in eager)
        print(json.dumps({{
            "no_runtime_for_pt2": no_runtime,
            "compiler_loaded": any(name == "compiler" or name.startswith("compiler.") for name in sys.modules),
            "same": same,
        }}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=work)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "no_runtime_for_pt2": True,
        "compiler_loaded": False,
        "same": {"7": True, "1": True, "no ids": True},
    }


def test_a_corrupted_or_mixed_export_directory_is_refused_with_a_clear_error(work: Path, tmp_path: Path) -> None:
    def copy(name: str) -> Path:
        return Path(shutil.copytree(work / "int8", tmp_path / name))

    def refused(directory: Path) -> str:
        with pytest.raises(ExportError) as error:
            load(directory)
        return str(error.value)

    assert refused(tmp_path / "nothing") == f"export directory {tmp_path / 'nothing'} does not exist"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refused(empty) == f"{empty}: no manifest.json; not an export directory (write one with reccompile export)"

    listing = copy("listing") / "manifest.json"
    listing.write_text("[1]")
    assert refused(listing.parent) == f"{listing}: not a reccompile export manifest (format 'list')"
    listing.write_text('{"format": "reccompile-export", "format_version": 2}')
    assert refused(listing.parent) == f"{listing}: format version 2; this runtime reads version 1"
    listing.write_text('{"format": ')
    assert refused(listing.parent) == (
        f"{listing}: not valid JSON (Expecting value: line 1 column 12 (char 11)); export again"
    )

    truncated = copy("truncated")
    table = truncated / "weights" / "tables" / "items.pt"
    size = table.stat().st_size
    table.write_bytes(table.read_bytes()[:-10])
    assert refused(truncated) == (
        f"{table}: {size - 10:,} bytes, manifest.json says {size:,}; the export is incomplete or corrupted, export again"
    )

    flipped = copy("flipped")
    table = flipped / "weights" / "tables" / "user.pt"
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table.write_bytes(bytes(data))
    manifest = json.loads((flipped / "manifest.json").read_text())
    listed = next(t["sha256"] for t in manifest["tables"] if t["name"] == "user")
    from runtime.serving.export_dir import file_facts

    actual = file_facts(table)["sha256"]
    assert refused(flipped) == (
        f"{table}: sha256 {actual[:12]}… does not match manifest.json ({listed[:12]}…); "
        "the file was changed or corrupted, export again"
    )

    mixed = copy("mixed_up")
    shutil.copy(work / "fp32" / "manifest.json", mixed / "manifest.json")
    module_file = mixed / "small_rec.py"
    module_sha = file_facts(module_file)["sha256"]
    fp32_sha = json.loads((work / "fp32" / "manifest.json").read_text())["module"]["sha256"]
    assert refused(mixed) == (
        f"{module_file}: sha256 {module_sha[:12]}… does not match manifest.json ({fp32_sha[:12]}…); "
        "the file was changed or corrupted, export again"
    )
    from runtime.serving.export_dir import import_module

    int8_module = import_module(work / "int8" / "small_rec.py")
    with pytest.raises(ExportError) as error:
        int8_module.build(work / "fp32")
    assert str(error.value) == (
        f"{work / 'fp32'}: table 'user' is fp32 in manifest.json but int8 in the module; "
        "the files come from different exports"
    )


def test_layout_json_is_checked_against_the_manifest_and_the_module(work: Path, tmp_path: Path) -> None:
    from runtime.serving.export_dir import file_facts

    edited = Path(shutil.copytree(work / "int8", tmp_path / "edited"))
    layout_file = edited / "layout.json"
    layout = json.loads(layout_file.read_text())
    layout["tables"][0]["rows"] += 1
    layout_file.write_text(json.dumps(layout, indent=2) + "\n")
    actual = file_facts(layout_file)["sha256"]
    listed = json.loads((edited / "manifest.json").read_text())["layout"]["sha256"]
    with pytest.raises(ExportError) as error:
        load(edited)
    assert str(error.value) == (
        f"{layout_file}: sha256 {actual[:12]}… does not match manifest.json ({listed[:12]}…); "
        "the file was changed or corrupted, export again"
    )
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["layout"].update(file_facts(layout_file))  # the manifest edited to match
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError) as error:
        load(edited)
    assert str(error.value) == (
        f"{layout_file}: describes other tables than the module's; the files come from different exports"
    )


def test_export_refuses_a_checkpoint_of_another_spec_and_bad_choices(work: Path, tmp_path: Path, capsys) -> None:
    edited = tmp_path / "edited.yaml"
    edited.write_text(SPEC.replace("lr: 0.05}\n  sparse", "lr: 0.06}\n  sparse"))
    args = ["export", str(edited), "--checkpoint", str(work / "ckpt"), "-o", str(tmp_path / "out")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {work / 'ckpt'}: trained from a spec with sha256 ")
    assert err.endswith("(pass --allow-spec-change to export it anyway; shapes are still checked)\n")
    assert main([*args, "--allow-spec-change", "--no-aot"]) == 0
    assert not (tmp_path / "out" / "small_rec.pt2").exists()
    capsys.readouterr()

    spec = str(work / "small.yaml")
    assert (
        main(
            ["export", spec, "--checkpoint", str(work / "ckpt"), "--per-table", "users=int4", "-o", str(tmp_path / "x")]
        )
        == 2
    )
    assert (
        capsys.readouterr().err == f"error: --per-table: {spec} has no table 'users' (tables: user, items, tag_table)\n"
    )
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["export", spec, "--checkpoint", str(work / "ckpt"), "-o", str(tmp_path / "taken")]) == 1
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'taken'} exists and is not an export directory; choose another -o or empty it\n"
    )
    assert main(["predict", str(tmp_path / "taken"), "-o", str(tmp_path / "p.csv")]) == 1
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'taken'}: no manifest.json; not an export directory (write one with reccompile export)\n"
    )


def test_export_refuses_to_replace_a_checkpoint_directory(work: Path, tmp_path: Path, capsys) -> None:
    """A checkpoint step has a manifest.json too: -o naming it must not replace the checkpoint."""
    checkpoint = Path(shutil.copytree(work / "ckpt", tmp_path / "ckpt"))
    step = checkpoint / "step_00000003"
    before = sorted(p.name for p in step.iterdir())
    capsys.readouterr()
    assert main(["export", str(work / "small.yaml"), "--checkpoint", str(checkpoint), "--no-aot", "-o", str(step)]) == 1
    assert capsys.readouterr().err == (
        f"error: {step} exists and is not an export directory; choose another -o or empty it\n"
    )
    assert sorted(p.name for p in step.iterdir()) == before
    again = [
        "export",
        str(work / "small.yaml"),
        "--checkpoint",
        str(checkpoint),
        "--no-aot",
        "-o",
        str(tmp_path / "out"),
    ]
    assert main(again) == main(again) == 0  # an export is replaced as before


def test_a_table_beyond_what_its_precision_stores_is_refused_naming_the_checkpoint(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "large.yaml"
    spec.write_text(
        textwrap.dedent("""\
        version: 1
        name: large
        features:
          dense:
            - {name: num, size: 4}
          sparse:
            - {name: a, table: ta}
        tables:
          - {name: ta, num_embeddings: 100, dim: 8, init: {min: 65000, max: 70000}}
        model:
          top: {type: mlp, input: [dense.num, sparse.a], layers: [8, 1]}
        heads:
          - {name: click, input: top, loss: bce}
        training:
          batch_size: 32
        """)
    )
    checkpoint = tmp_path / "ckpt"
    assert (
        main(["train", str(spec), "--steps", "1", "--checkpoint-dir", str(checkpoint), "-o", str(tmp_path / "build")])
        == 0
    )
    capsys.readouterr()
    for precision in ("fp16", "int8", "int4"):  # int8 and int4 rows would hold inf scales: NaN scores
        args = ["export", str(spec), "--checkpoint", str(checkpoint), "--quantize", precision, "--no-aot"]
        assert main([*args, "-o", str(tmp_path / precision)]) == 1
        err = capsys.readouterr().err
        held = "its values" if precision == "fp16" else "each row's scale and bias"
        assert err.startswith(f"error: {checkpoint}: table 'ta': a value of magnitude ")
        assert err.endswith(
            f" is beyond float16's range (±65504), in which {precision} stores {held}; export the table at fp32\n"
        )
    assert main(["export", str(spec), "--checkpoint", str(checkpoint), "--no-aot", "-o", str(tmp_path / "fp32")]) == 0


def test_export_warns_nobody(tmp_path: Path) -> None:
    """torch's .pt2 packaging warns when weights are views of one buffer and none is whole, as the
    tables are once their buffer sits on huge pages (8 MiB and more): the export's output is the
    table of sizes, not torch's warning about its own packaging."""
    spec = tmp_path / "big.yaml"
    spec.write_text(
        SPEC.replace("{name: user, num_embeddings: 200, dim: 8}", "{name: user, num_embeddings: 600000, dim: 8}")
    )
    assert (
        main(
            [
                "train",
                str(spec),
                "--steps",
                "1",
                "--batch-size",
                "64",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "-o",
                str(tmp_path / "build"),
            ]
        )
        == 0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert (
            main(
                [
                    "export",
                    str(spec),
                    "--checkpoint",
                    str(tmp_path / "ckpt"),
                    "--quantize",
                    "fp16",
                    "-o",
                    str(tmp_path / "out"),
                ]
            )
            == 0
        )
    assert (tmp_path / "out" / "small_rec.pt2").is_file()
    assert [str(w.message) for w in caught] == []


def test_a_damaged_latest_checkpoint_names_the_newest_intact_one(work: Path, tmp_path: Path, capsys) -> None:
    """Export takes the latest checkpoint and does not pass over a damaged one (that would export an
    older model than asked for, unnoticed); its error names the one to pass instead."""
    checkpoints = tmp_path / "ck"
    shutil.copytree(work / "ckpt", checkpoints, ignore=shutil.ignore_patterns(".lock"))
    shutil.copytree(checkpoints / "step_00000003", checkpoints / "step_00000004")
    distcp = checkpoints / "step_00000004" / "__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:100])
    assert (
        main(["export", str(work / "small.yaml"), "--checkpoint", str(checkpoints), "-o", str(tmp_path / "out")]) == 1
    )
    intact = checkpoints / "step_00000003"
    assert capsys.readouterr().err.endswith(
        f"; the newest intact checkpoint there is {intact}: pass --checkpoint {intact} to export it\n"
    )
    assert (
        main(["export", str(work / "small.yaml"), "--checkpoint", str(intact), "--no-aot", "-o", str(tmp_path / "out")])
        == 0
    )
