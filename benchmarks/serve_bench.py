"""serve-bench: `reccompile serve` under load, against offline `predict` and LitServe on the same export.

    python benchmarks/serve_bench.py [--seconds 8] [--clients 1,8,16,64] [--rows 1,64] [--threads T]

Builds the model once: specs/two_tower_movielens.yaml trained 2 steps on a
generated ml-1m-shaped ratings file (6,040 users, 3,952 movies; the scores'
values do not matter, their cost does) and exported at fp32. Then, one JSON
line per result:

    {"server": "predict", ...}        offline `reccompile predict` of 50,000 rows at batch 512: rows/s
    {"server": "reccompile", "clients": C, "rows": R, "p50_ms", "p99_ms", "requests_per_s", "rows_per_s",
     "failures", ...}                 `reccompile serve` (--max-batch 64, --max-wait-ms from the option)
    {"server": "litserve", ...}       LitServe serving the same export (benchmarks/serve_litserve.py)
    {"summary": ...}                  the issue's targets: 16 single-row clients vs predict's rows/s,
                                      p99/p50 at 8 clients, and reccompile's rows/s over LitServe's

The load is locust (`benchmarks/serve_locust.py`, FastHttpUser, no think
time: each client sends its next request when the last is answered) for
`--seconds` per point, headless, its percentiles read from its CSV (locust
rounds them to two significant figures). Every server gets the same
`--threads` and listens on 127.0.0.1. On a 2-core machine the load generator
shares the cores with the server, so the figures are lower bounds, and noisy
where other work runs: compare the servers side by side, within one run.
Needs the `serve-bench` extra (aiohttp, locust, litserve).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "specs" / "two_tower_movielens.yaml"
USERS, MOVIES = 6040, 3952
PYTHON = sys.executable


def _cli(*args: str, cwd: Path) -> str:
    done = subprocess.run([PYTHON, "-m", "compiler.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"reccompile {args[0]} failed:\n{done.stderr}")
    return done.stdout


def build_export(work: Path) -> Path:
    """A two_tower_movielens export trained 2 steps on generated ratings (users 1..6040, movies 1..3952)."""
    rng = random.Random(0)
    genres = ["Action", "Comedy", "Drama", "Romance", "Thriller", "Animation"]
    (work / "movies.dat").write_text("".join(
        f"{m}::Movie {m} (2000)::{'|'.join(rng.sample(genres, rng.randint(1, 3)))}\n" for m in range(1, MOVIES + 1)
    ))  # fmt: skip
    lines = [f"{u}::{rng.randint(1, MOVIES)}::{rng.randint(1, 5)}::{978300000 + i}" for i, u in
             enumerate(list(range(1, USERS + 1)) * 2)]  # fmt: skip
    (work / "ratings.dat").write_text("\n".join(lines) + "\n")
    _cli("train", str(SPEC), "--data", "movielens:ratings.dat", "--steps", "2", "--data-workers", "0",
         "--checkpoint-dir", "ckpt", "-o", "build", cwd=work)  # fmt: skip
    _cli("export", str(SPEC), "--checkpoint", "ckpt", "--no-aot", "-o", "out", cwd=work)
    return work / "out"


def offline_predict(work: Path, threads: int) -> dict[str, Any]:
    rng = random.Random(1)
    (work / "requests.dat").write_text("".join(
        f"{rng.randint(1, USERS)}::{rng.randint(1, MOVIES)}::5::0\n" for _ in range(50_000)
    ))  # fmt: skip
    out = _cli("predict", "out", "--data", "movielens:requests.dat", "--batch-size", "512", "--threads", str(threads),
               "-o", "predicted.csv", cwd=work)  # fmt: skip
    found = re.search(r"in ([\d.]+) s: ([\d,]+) rows/s \(([\d,]+) rows/s in the model\)", out)
    assert found, out
    rows_per_s, model_rows_per_s = (int(found.group(g).replace(",", "")) for g in (2, 3))
    return {"server": "predict", "rows": 50_000, "batch": 512, "seconds": float(found.group(1)),
            "rows_per_s": rows_per_s, "model_rows_per_s": model_rows_per_s}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, process: subprocess.Popen, seconds: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url}: not ready after {seconds:.0f} s")


def start_reccompile(export: Path, threads: int, port: int, max_wait_ms: float) -> subprocess.Popen:
    process = subprocess.Popen(
        [PYTHON, "-m", "compiler.cli", "serve", str(export), "--port", str(port), "--threads", str(threads),
         "--max-batch", "64", "--max-wait-ms", f"{max_wait_ms:g}"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process)
    return process


def start_litserve(export: Path, threads: int, port: int, max_wait_ms: float) -> subprocess.Popen:
    process = subprocess.Popen(
        [PYTHON, str(Path(__file__).with_name("serve_litserve.py")), str(export), "--port", str(port),
         "--threads", str(threads), "--max-wait-ms", f"{max_wait_ms:g}"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # LitServe starts worker processes: stop the whole group
    )  # fmt: skip
    _wait_ready(f"http://127.0.0.1:{port}/health", process)
    return process


def stop(process: subprocess.Popen, group: bool = False) -> None:
    if process.poll() is None:
        if group:
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL) if group else process.kill()
            process.wait()


def load(url: str, path: str, clients: int, rows: int, seconds: float, work: Path) -> dict[str, Any]:
    """One locust run: `clients` closed-loop users sending `rows`-row requests for `seconds`."""
    prefix = work / f"locust_{clients}_{rows}"
    env = {**os.environ, "SERVE_PATH": path, "SERVE_ROWS": str(rows),
           "SERVE_USERS": ",".join(map(str, range(1, USERS + 1, 7))),
           "SERVE_MOVIES": ",".join(map(str, range(1, MOVIES + 1, 5)))}  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(Path(__file__).with_name("serve_locust.py")), "--headless",
         "-u", str(clients), "-r", str(clients), "-t", f"{seconds:g}s", "--host", url, "--csv", str(prefix),
         "--only-summary", "--loglevel", "ERROR", "--stop-timeout", "5"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 120,
    )  # fmt: skip
    with open(f"{prefix}_stats.csv", newline="") as stream:
        total = next(row for row in csv.DictReader(stream) if row["Name"] == "Aggregated")
    per_s = float(total["Requests/s"])
    return {"clients": clients, "rows": rows, "seconds": seconds, "requests": int(total["Request Count"]),
            "failures": int(total["Failure Count"]), "p50_ms": float(total["50%"]), "p99_ms": float(total["99%"]),
            "requests_per_s": round(per_s, 1), "rows_per_s": round(per_s * rows, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="locust run time per point (default 8)")
    parser.add_argument("--clients", default="1,8,16,64", help="concurrent clients (default 1,8,16,64)")
    parser.add_argument("--rows", default="1,64", help="rows per request (default 1,64)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every server and predict (default 1)")
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        help="every server's batch wait (default 2, `reccompile serve`'s default)",
    )
    parser.add_argument("--servers", default="reccompile,litserve", help="which servers (default both)")
    args = parser.parse_args()
    from runtime.cpu.features import model as cpu_model

    common = {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "model": SPEC.stem,
        "max_batch": 64,
        "max_wait_ms": args.max_wait_ms,
    }
    results: dict[tuple[str, int, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="serve_bench_") as tmp:
        work = Path(tmp)
        export = build_export(work)
        offline = offline_predict(work, args.threads)
        print(json.dumps({**offline, **common}), flush=True)
        for server in args.servers.split(","):
            port = _free_port()
            group = server == "litserve"
            process = (start_litserve if group else start_reccompile)(export, args.threads, port, args.max_wait_ms)
            path = "/predict" if group else "/v2/models/two_tower_movielens/infer"
            try:
                for rows in map(int, args.rows.split(",")):
                    for clients in map(int, args.clients.split(",")):
                        result = {
                            "server": server,
                            **load(f"http://127.0.0.1:{port}", path, clients, rows, args.seconds, work),
                        }
                        results[server, clients, rows] = result
                        print(json.dumps({**result, **common}), flush=True)
            finally:
                stop(process, group)
    summary: dict[str, Any] = {"offline_predict_rows_per_s": offline["rows_per_s"]}
    ours = results.get(("reccompile", 16, 1))
    if ours:
        summary["serve_16x1_rows_per_s_over_predict"] = round(ours["rows_per_s"] / offline["rows_per_s"], 3)
    half = results.get(("reccompile", 8, 1))
    if half:
        summary["serve_8x1_p99_over_p50"] = round(half["p99_ms"] / half["p50_ms"], 2)
    theirs = results.get(("litserve", 16, 1))
    if ours and theirs:
        summary["serve_16x1_rows_per_s_over_litserve"] = round(ours["rows_per_s"] / max(theirs["rows_per_s"], 1e-9), 2)
    print(json.dumps({"summary": summary, **common}), flush=True)


if __name__ == "__main__":
    main()
