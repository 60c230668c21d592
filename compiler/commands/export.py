"""`reccompile export SPEC --checkpoint DIR -o OUT`: a trained model as a serving directory.

    reccompile export SPEC --checkpoint DIR [--quantize fp16|int8|int4|none]
                           [--per-table t0=int4,t3=fp32] [--dense fp32|bf16|int8] [--no-aot]
                           [--allow-spec-change] [--index auto|exact|flat|ivf|hnsw]
                           [--eval-data movielens:FILE|... [--history movielens:TRAIN]] -o OUT

Writes OUT/ (see compiler/serving/export.py and runtime/serving/export_dir.py): the generated
inference module, the weights at each table's precision, the layout, the
torch.export program and the manifest; prints one row per table with its
size on disk. A retrieval model (a sampled_softmax head) also gets its item
vectors and their index, and the line saying how the index's recall@100
compares with exact search's (on --eval-data's held-out positives; a next-item
model's take their histories from --history, the training ratings they were split from). Exit status 1 when the spec, the checkpoint or the export
fails, 2 for bad command-line use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compiler.commands.common import reporting_errors
from compiler.serving.export import DENSE_CHOICES, QUANTIZE_CHOICES, ExportRequest, UsageError, export
from runtime.checkpoint.files import CheckpointError
from runtime.data.errors import DataError
from runtime.retrieval.index import INDEX_KINDS
from runtime.retrieval.index_files import IndexFileError
from runtime.serving.item_index import ItemsReport
from runtime.serving.export_dir import ExportError
from runtime.storage.output import OutputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="the model spec (YAML) the checkpoint was trained from")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        metavar="DIR",
        help="a checkpoint, or a directory of them (the latest is used)",
    )
    parser.add_argument(
        "--quantize", choices=QUANTIZE_CHOICES, default="none", help="precision of every table (default none: fp32)"
    )
    parser.add_argument(
        "--per-table",
        type=_per_table,
        default={},
        metavar="T=P,...",
        help="precision of single tables, e.g. t0=int4,t3=fp32 (wins over --quantize)",
    )
    parser.add_argument(
        "--dense",
        choices=DENSE_CHOICES,
        default="fp32",
        help="dtype of the dense blocks (default fp32, exact; bf16 is not exact, and faster only where bf16 GEMMs beat oneDNN fp32 ones; int8: MLP blocks on int8 layers where measured faster, not exact, the .pt2 keeps them fp32)",
    )
    parser.add_argument("--no-aot", dest="aot", action="store_false", help="skip the torch.export program (<name>.pt2)")
    parser.add_argument(
        "--allow-spec-change",
        action="store_true",
        help="export a checkpoint of another version of the spec (shapes still checked)",
    )
    parser.add_argument(
        "--index",
        choices=INDEX_KINDS,
        default="auto",
        help="retrieval models: the item index (auto: faiss flat up to 65,536 items, ivf above; exact without faiss)",
    )
    parser.add_argument(
        "--eval-data",
        metavar="READER:PATH",
        help="retrieval models: held-out requests (e.g. `reccompile data split`'s test part) "
        "to measure the index's recall@100 against exact search",
    )
    parser.add_argument(
        "--history",
        metavar="movielens:TRAIN",
        help="next-item models: the training ratings --eval-data was split from, where each "
        "held-out request's history is cut from",
    )
    parser.add_argument(
        "--rating-threshold", type=float, default=4.0, help="MovieLens --eval-data: rating >= T is a positive (4)"
    )
    parser.add_argument("-o", "--outdir", type=Path, required=True, metavar="OUT", help="the export directory")


def run(args: argparse.Namespace) -> int:
    def action() -> int:
        request = ExportRequest(
            spec=args.spec,
            checkpoint=args.checkpoint,
            outdir=args.outdir,
            quantize=args.quantize,
            per_table=args.per_table,
            dense=args.dense,
            aot=args.aot,
            allow_spec_change=args.allow_spec_change,
            index=args.index,
            eval_data=args.eval_data,
            rating_threshold=args.rating_threshold,
            history=args.history,
        )
        try:
            result = export(request)
        except UsageError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except (ExportError, CheckpointError, DataError, IndexFileError, OutputError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(summary(result.manifest, args.outdir))
        if result.items is not None:
            section = result.manifest["retrieval"]
            print(items_summary(section, result.items, args.outdir))
            warning = items_warning(section, result.items)
            if warning is not None:
                print(warning, file=sys.stderr)
        return 0

    return reporting_errors(action)


def summary(manifest: dict, outdir: Path) -> str:
    """One row per table (precision, bytes on disk, against fp32), the totals and the files."""
    lines = [f"{'table':<16} {'rows':>10} {'dim':>5} {'precision':>9} {'bytes on disk':>15} {'vs fp32':>8}"]
    for table in manifest["tables"]:
        lines.append(
            f"{table['name']:<16} {table['rows']:>10,} {table['dim']:>5} {table['precision']:>9} "
            f"{table['bytes']:>15,} {table['fp32_bytes'] / table['bytes']:>7.2f}x"
        )
    lines.append(f"{'all tables':<44} {manifest['tables_bytes']:>15,} {manifest['tables_compression'] or 0:>7.2f}x")
    files = [manifest["module"], manifest["layout"], manifest["dense"]]
    files += [manifest["aot"]] if manifest["aot"] else []
    if manifest["aot"] is None and any(table["lookup"] == "rows" for table in manifest["tables"]):
        lines.append(f"no {manifest['name']}.pt2: torch.export cannot trace sequence lookups; serve the module")
    files += [manifest["vocabulary"]] if manifest["vocabulary"] else []
    files += [manifest["features"]] if manifest.get("features") else []
    lines += [f"wrote {outdir / entry['file']} ({entry['bytes']:,} bytes)" for entry in files]
    lines.append(f"wrote {outdir / 'weights' / 'tables'}/ ({len(manifest['tables'])} tables)")
    lines.append(f"wrote {outdir / 'manifest.json'}")
    return "\n".join(lines)


def items_summary(section: dict, items: ItemsReport, outdir: Path) -> str:
    """The catalogue, the index and its recall check."""
    index = section["index"]
    lines = [
        f"wrote {outdir / section['item_vectors']['file']} ({items.items:,} items x {section['dim']})",
        f"wrote {outdir / index['directory']}/ ({index['kind']} index"
        + (f", {', '.join(f'{k} {v}' for k, v in index['params'].items())})" if index["params"] else ")"),
        items.describe(),
    ]
    return "\n".join(lines)


def items_warning(section: dict, items: ItemsReport) -> str | None:
    """What to say when the index keeps less than the threshold of exact search's recall."""
    if items.quality.ok:
        return None
    return (
        f"warning: the {section['index']['kind']} index keeps less than {items.quality.threshold:g} of exact "
        f"search's recall@{items.quality.k}: export with --index flat (or exact) to serve exact results"
    )


def _per_table(text: str) -> dict[str, str]:
    choices: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, precision = item.partition("=")
        if not equals or not name or not precision:
            raise argparse.ArgumentTypeError(f"expected TABLE=PRECISION, got {item!r}")
        if name in choices:
            raise argparse.ArgumentTypeError(f"table {name!r} is given twice")
        choices[name] = "fp32" if precision == "none" else precision
    return choices
