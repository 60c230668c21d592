"""`reccompile serve OUT [OUT ...]`: answer live requests with exported models (Open Inference Protocol, REST).

    reccompile serve OUT [OUT ...] [--pipeline RETRIEVAL_OUT RANKING_OUT --k K --n N]
                     [--reader R] [--host 127.0.0.1] [--port 8000] [--max-batch B] [--max-wait-ms T]
                     [--max-queue ROWS] [--max-body BYTES] [--threads T] [--drain-seconds S] [--no-verify]
                     [--watch] [--watch-every SECONDS] [--grpc-port PORT]

Each export is served under its spec's name (runtime/serving/online/: raw
columns in through the readers' parsing, concurrent requests batched,
`/metrics`, reload by `POST /v2/repository/models/NAME/load`, SIGHUP, or
`--watch`: a new complete export in a served directory);
`--pipeline` serves a retrieval export's top K re-ranked by a ranking
export, the best N answered, as one model named RETRIEVAL_then_RANKING.
`--grpc-port` adds the protocol's gRPC binding (the `grpc` extra:
grpcio, tritonclient's generated stubs). Prints the address once listening
(the real port for `--port 0`); SIGTERM or
Ctrl-C stops listening, finishes the requests in flight and exits 0. Needs
the `serve` extra (aiohttp). Exit status 1 when an export cannot be served,
2 for bad usage.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.commands.common import positive_int

if TYPE_CHECKING:
    from runtime.serving.online.models import ServedModel

INSTALL = "pip install 'reccompile[serve]' (or: pip install aiohttp)"
INSTALL_GRPC = "pip install 'reccompile[grpc]' (or: pip install grpcio 'tritonclient[grpc]')"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("exports", metavar="OUT", type=Path, nargs="*", help="export directories (reccompile export)")
    parser.add_argument(
        "--pipeline",
        nargs=2,
        type=Path,
        metavar=("RETRIEVAL_OUT", "RANKING_OUT"),
        help="serve retrieval then ranking in one request",
    )
    parser.add_argument(
        "--k",
        type=positive_int,
        default=10,
        help="items a retrieval model gives per row; with --pipeline, the candidates ranked (default 10)",
    )
    parser.add_argument("--n", type=positive_int, default=10, help="--pipeline: the ranked items answered (default 10)")
    parser.add_argument(
        "--reader",
        choices=("criteo", "csv", "parquet", "movielens"),
        help="whose columns requests carry, for a spec without a data section "
        "(default: the spec's; movielens for an export with a vocabulary)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8000, help="the port (default 8000; 0: any free port)")
    parser.add_argument("--max-batch", type=positive_int, default=64, help="rows per model batch at most (default 64)")
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=0.0,
        help="how long the first request of a batch waits for others (default 0: none; a request that finds "
        "the model idle runs at once, those that arrive while a batch runs make the next batch)",
    )
    parser.add_argument(
        "--max-queue",
        type=positive_int,
        default=4096,
        help="rows queued at most; more answer 503 with Retry-After (default 4096)",
    )
    parser.add_argument(
        "--max-body", type=positive_int, default=4 << 20, help="request body bytes at most (default 4 MiB)"
    )
    parser.add_argument("--threads", type=positive_int, help="torch intra-op threads (default: the free cores)")
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        help="on SIGTERM, how long requests in flight may take to finish (default 30)",
    )
    parser.add_argument(
        "--no-verify", dest="verify", action="store_false", help="check file sizes only, not their sha256"
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="swap in a new export written to a served directory (its manifest.json changed); "
        "an incomplete or corrupt one is refused and the old model keeps serving",
    )
    parser.add_argument("--watch-every", type=float, default=1.0, help="--watch: seconds between looks (default 1)")
    parser.add_argument(
        "--grpc-port",
        type=int,
        help="also answer the protocol's gRPC binding on this port (0: any free port; needs the grpc extra)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.exports and args.pipeline is None:
        print("error: give an export directory OUT to serve, or --pipeline RETRIEVAL_OUT RANKING_OUT", file=sys.stderr)
        return 2
    if args.max_wait_ms < 0 or args.drain_seconds < 0 or not 0 <= args.port < 65536:
        print("error: --max-wait-ms and --drain-seconds must be >= 0, --port in 0..65535", file=sys.stderr)
        return 2
    if not args.watch_every > 0:
        print(f"error: --watch-every {args.watch_every:g}: must be a number of seconds above 0", file=sys.stderr)
        return 2
    if importlib.util.find_spec("aiohttp") is None:
        print(f"error: reccompile serve needs the aiohttp package: {INSTALL}", file=sys.stderr)
        return 1
    if args.grpc_port is not None and not 0 <= args.grpc_port < 65536:
        print("error: --grpc-port must be in 0..65535", file=sys.stderr)
        return 2
    if args.grpc_port is not None and not all(importlib.util.find_spec(m) for m in ("grpc", "tritonclient")):
        print(f"error: --grpc-port needs the grpcio and tritonclient packages: {INSTALL_GRPC}", file=sys.stderr)
        return 1
    import torch

    from runtime.cpu.allocator import frozen_objects, retain_freed_memory
    from runtime.cpu.threads import process_threads
    from runtime.data.errors import DataError
    from runtime.retrieval.index_files import IndexFileError
    from runtime.serving.export_dir import ExportError
    from runtime.serving.online.app import make_app
    from runtime.serving.online.app import run as run_server
    from runtime.serving.online.batcher import INLINE_ROWS
    from runtime.serving.online.metrics import Metrics
    from runtime.serving.online.models import load_model, load_pipeline
    from runtime.serving.online.registry import BatchOptions, Slot

    threads = process_threads(args.threads)
    torch.set_num_threads(threads.threads)
    retain_freed_memory()
    metrics = Metrics()
    # On one core a batch on the batcher's thread overlaps nothing: every batch runs on the event loop.
    inline_rows = args.max_batch if threads.usable == 1 else INLINE_ROWS
    options = BatchOptions(args.max_batch, args.max_wait_ms / 1000, args.max_queue, inline_rows)
    loaders: list[tuple[Callable[[], ServedModel], tuple[Path, ...]]] = [
        (partial(load_model, out, k=args.k, verify=args.verify, reader=args.reader), (out,)) for out in args.exports
    ]
    if args.pipeline is not None:
        retrieval, ranking = args.pipeline
        load_both = partial(
            load_pipeline, retrieval, ranking, k=args.k, n=args.n, verify=args.verify, reader=args.reader
        )
        loaders.append((load_both, (retrieval, ranking)))
    slots: dict[str, Slot] = {}
    try:
        with frozen_objects():  # the loaded models are no garbage: full collections skip them
            for load, directories in loaders:
                slot = Slot(load, options, metrics, directories)
                if slot.model.name in slots:
                    print(
                        f"error: two exports are both model {slot.model.name!r}: serve them from two servers",
                        file=sys.stderr,
                    )
                    return 1
                slots[slot.model.name] = slot
    except (ExportError, IndexFileError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for name, slot in slots.items():
        inputs = ", ".join(f"{i.name} {i.datatype}" for i in slot.model.inputs)
        print(f"model {name!r} from {slot.model.source}: inputs {inputs}")

    def announce(url: str, grpc_address: str | None) -> None:
        if grpc_address is not None:
            print(f"gRPC on {grpc_address}", flush=True)
        print(
            f"listening on {url} (batches of up to {args.max_batch} rows, {args.max_wait_ms:g} ms wait; "
            f"{threads.describe()})",
            flush=True,
        )

    def reloaded(name: str, error: BaseException | None) -> None:
        if error is None:
            print(f"reloaded {name!r}", flush=True)
        else:
            print(
                f"error: reload of {name!r} failed: {error}; the previous export keeps serving",
                file=sys.stderr,
                flush=True,
            )

    app = make_app(slots, metrics, args.max_body)
    run_server(
        app,
        slots,
        host=args.host,
        port=args.port,
        drain_seconds=args.drain_seconds,
        announce=announce,
        on_reload=reloaded,
        watch_every=args.watch_every if args.watch else None,
        grpc_port=args.grpc_port,
        metrics=metrics,
        max_body=args.max_body,
    )
    print("stopped: every request answered", flush=True)
    return 0
