"""serve-bench: `reccompile serve` under load, against offline `predict`, LitServe and a trivial endpoint.

    python benchmarks/serve_bench.py [--seconds 8] [--clients 1,8,16,64] [--rows 1,64] [--threads T]

Builds the model once: specs/two_tower_movielens.yaml trained 2 steps on a
generated ml-1m-shaped ratings file (6,040 users, 3,952 movies; the scores'
values do not matter, their cost does) and exported at fp32. Then, one JSON
line per result:

    {"server": "predict", "batch": 512, ...}   offline `reccompile predict` of 50,000 rows: rows/s
    {"server": "trivial", ...}                  the ceiling: an aiohttp endpoint that reads the body and
                                                answers a fixed score (benchmarks/serve_trivial.py)
    {"server": "reccompile", "clients": C, "rows": R, "p50_ms", "p99_ms", "requests_per_s", "rows_per_s",
     "failures", "server_cpu_us_per_request", "mean_batch_rows", "server_p50_ms", "server_p99_ms",
     "batch_p99_ms", "batch_cpu_p99_ms", "loop_lag_p99_ms", "loop_lag_max_ms", "gc_pauses", "gc_max_ms",
     "involuntary_switches_per_s", ...}
                                                `reccompile serve` (--max-batch 64, --max-wait-ms)
    {"server": "litserve", ...}                 LitServe serving the same export (benchmarks/serve_litserve.py)
    {"server": "predict", "batch": B, ...}      predict again at the batch the server ran 16 single-row
                                                clients with (its mean, from /metrics)
    {"summary": ...}                            the issue's targets: 16 single-row clients vs predict's
                                                rows/s, the trivial ceiling's fraction of it, p99/p50 at
                                                8 clients, reccompile's rows/s over LitServe's

The load is locust (`benchmarks/serve_locust.py`, FastHttpUser, no think
time: each client sends its next request when the last is answered) for
`--seconds` per point, headless, its percentiles read from its CSV (locust
rounds them to two significant figures). Every server gets the same
`--threads` and listens on 127.0.0.1. With 2 cores or more, every server
(its worker processes too) is pinned to the first core and locust to the
second (`taskset`), so the load generator does not take the server's core;
the lines say so ("server_cpus", "load_cpus"). reccompile's `server_p50_ms`
and `server_p99_ms` are the server's own latency (from the body read to the
answer; its /metrics histogram over the run, 0.1 ms buckets below 1 ms,
the quantile interpolated in its bucket) beside locust's client-side ones:
a client p99 far above the server's is the load generator's and the
machine's, not ours. `batch_p99_ms` is a model batch's call and
`batch_cpu_p99_ms` its CPU time (wall far above CPU: the OS ran other work),
`loop_lag_*` how late the event loop ran a 10 ms timer (a stall every
request behind it waited out), `gc_*` the collector's pauses (max: the
bucket's upper bound), `involuntary_switches_per_s` how often the OS took
the server's core away (psutil): on a shared machine the tail follows it.
`server_cpu_us_per_request`
is the server's own CPU time (psutil, children included) over the
requests answered: it holds still when other work on the machine slows
the wall clock, and 1e6 / it is the requests/s one whole core would give.
Needs the `serve-bench` extra (aiohttp, locust, litserve).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "specs" / "two_tower_movielens.yaml"
USERS, MOVIES = 6040, 3952
PYTHON = sys.executable
MODEL_PATH = "/v2/models/two_tower_movielens/infer"


def _pinning() -> tuple[list[str], list[str], dict[str, str]]:
    """The command prefixes pinning a server and the load generator to cores of their own, and what to say."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return [], [], {"server_cpus": "shared with the load", "load_cpus": "shared with the server"}
    server, load = str(cpus[0]), ",".join(map(str, cpus[1:]))
    return ["taskset", "-c", server], ["taskset", "-c", load], {"server_cpus": server, "load_cpus": load}


SERVER_PIN, LOAD_PIN, PINNING = _pinning()


def _cli(*args: str, cwd: Path, pin: bool = False) -> str:
    done = subprocess.run(
        [*(SERVER_PIN if pin else []), PYTHON, "-m", "compiler.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"reccompile {args[0]} failed:\n{done.stderr}")
    return done.stdout


def build_export(work: Path) -> Path:
    """A two_tower_movielens export trained 2 steps on generated ratings (users 1..6040, movies 1..3952)."""
    rng = random.Random(0)
    genres = ["Action", "Comedy", "Drama", "Romance", "Thriller", "Animation"]
    (work / "movies.dat").write_text(
        "".join(
            f"{m}::Movie {m} (2000)::{'|'.join(rng.sample(genres, rng.randint(1, 3)))}\n" for m in range(1, MOVIES + 1)
        )
    )
    lines = [
        f"{u}::{rng.randint(1, MOVIES)}::{rng.randint(1, 5)}::{978300000 + i}"
        for i, u in enumerate(list(range(1, USERS + 1)) * 2)
    ]
    (work / "ratings.dat").write_text("\n".join(lines) + "\n")
    _cli(
        "train",
        str(SPEC),
        "--data",
        "movielens:ratings.dat",
        "--steps",
        "2",
        "--data-workers",
        "0",
        "--checkpoint-dir",
        "ckpt",
        "-o",
        "build",
        cwd=work,
    )
    _cli("export", str(SPEC), "--checkpoint", "ckpt", "--no-aot", "-o", "out", cwd=work)
    return work / "out"


def offline_predict(work: Path, threads: int, batch: int = 512) -> dict[str, Any]:
    """`reccompile predict` of 50,000 generated rows at `batch`, on the server's core."""
    rng = random.Random(1)
    (work / "requests.dat").write_text(
        "".join(f"{rng.randint(1, USERS)}::{rng.randint(1, MOVIES)}::5::0\n" for _ in range(50_000))
    )
    out = _cli(
        "predict",
        "out",
        "--data",
        "movielens:requests.dat",
        "--batch-size",
        str(batch),
        "--threads",
        str(threads),
        "-o",
        "predicted.csv",
        cwd=work,
        pin=True,
    )
    found = re.search(r"in ([\d.]+) s: ([\d,]+) rows/s \(([\d,]+) rows/s in the model\)", out)
    assert found, out
    rows_per_s, model_rows_per_s = (int(found.group(g).replace(",", "")) for g in (2, 3))
    return {
        "server": "predict",
        "rows": 50_000,
        "batch": batch,
        "seconds": float(found.group(1)),
        "rows_per_s": rows_per_s,
        "model_rows_per_s": model_rows_per_s,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, process: subprocess.Popen, seconds: float = 300) -> None:
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


def start(server: str, export: Path, threads: int, port: int, max_wait_ms: float) -> subprocess.Popen:
    """`server` (reccompile, litserve or trivial) on 127.0.0.1:port, pinned to the server's core, once ready."""
    here = Path(__file__).parent
    command, ready = {
        "reccompile": (
            [
                PYTHON,
                "-m",
                "compiler.cli",
                "serve",
                str(export),
                "--threads",
                str(threads),
                "--max-batch",
                "64",
                "--max-wait-ms",
                f"{max_wait_ms:g}",
            ],
            "/v2/health/ready",
        ),
        "litserve": (
            [
                PYTHON,
                str(here / "serve_litserve.py"),
                str(export),
                "--threads",
                str(threads),
                "--max-wait-ms",
                f"{max_wait_ms:g}",
            ],
            "/health",
        ),
        "trivial": ([PYTHON, str(here / "serve_trivial.py")], "/v2/health/ready"),
    }[server]
    process = subprocess.Popen(
        [*SERVER_PIN, *command, "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # LitServe starts worker processes: stop the whole group
    )
    _wait_ready(f"http://127.0.0.1:{port}{ready}", process)
    return process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _involuntary_switches(pid: int) -> int:
    """Times the OS took the CPU from the process (and its children) so far."""
    import psutil

    process = psutil.Process(pid)
    return sum(p.num_ctx_switches().involuntary for p in [process, *process.children(recursive=True)])


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of the process and its children so far."""
    import psutil

    process = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def _batches(url: str) -> tuple[float, float]:
    """reccompile's (batches, rows batched) so far, from /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = [re.search(rf"^reccompile_batch_rows_{k}\{{[^}}]*\}} (\S+)$", text, re.M) for k in ("count", "sum")]
    return (float(found[0].group(1)), float(found[1].group(1))) if found[0] and found[1] else (0.0, 0.0)


def _histograms(url: str) -> dict[str, list[tuple[float, float]]]:
    """reccompile's latency histograms so far, from /metrics: family -> [(upper bound, cumulative count)]."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, list[tuple[float, float]]] = {}
    for family in ("request_seconds", "batch_seconds", "batch_cpu_seconds", "loop_lag_seconds", "gc_seconds"):
        for bound, count in re.findall(rf'^reccompile_{family}_bucket\{{[^}}]*le="([^"]+)"\}} (\S+)$', text, re.M):
            found.setdefault(family, []).append((float(bound), float(count)))
    return found


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile in ms of a histogram's cumulative buckets, linear within its bucket; None if empty."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    wanted, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= wanted:
            if bound == float("inf"):
                return round(1000 * lower, 3)  # past the last bound: at least it
            share = (wanted - below) / max(count - below, 1e-9)
            return round(1000 * (lower + share * (bound - lower)), 3)
        lower, below = bound, count
    return None


def _server_side(before: dict[str, list[tuple[float, float]]], after: dict[str, list[tuple[float, float]]]) -> dict:
    """The server's latency quantiles, batch and loop-lag p99, GC pauses over one run (after - before)."""
    delta = {
        family: [(bound, count - dict(before.get(family, [])).get(bound, 0.0)) for bound, count in buckets]
        for family, buckets in after.items()
    }

    def highest(buckets: list[tuple[float, float]]) -> float | None:
        """The upper bound of the highest bucket holding an observation (ms): the largest value, rounded up."""
        total, last = (buckets[-1][1] if buckets else 0.0), None
        for bound, count in reversed(buckets):
            if count < total:
                break
            last = bound
        return None if last is None or total == 0 else round(1000 * last, 3)

    gc = delta.get("gc_seconds", [])
    return {
        "server_p50_ms": _quantile(delta.get("request_seconds", []), 0.5),
        "server_p99_ms": _quantile(delta.get("request_seconds", []), 0.99),
        "batch_p99_ms": _quantile(delta.get("batch_seconds", []), 0.99),
        "batch_cpu_p99_ms": _quantile(delta.get("batch_cpu_seconds", []), 0.99),
        "loop_lag_p99_ms": _quantile(delta.get("loop_lag_seconds", []), 0.99),
        "loop_lag_max_ms": highest(delta.get("loop_lag_seconds", [])),
        "gc_pauses": int(gc[-1][1]) if gc else 0,
        "gc_max_ms": highest(gc),
    }


def load(server: str, url: str, clients: int, rows: int, seconds: float, work: Path, pid: int) -> dict[str, Any]:
    """One locust run on the load's cores: `clients` closed-loop users sending `rows`-row requests for `seconds`."""
    path = "/predict" if server == "litserve" else MODEL_PATH
    prefix = work / f"locust_{clients}_{rows}"
    env = {
        **os.environ,
        "SERVE_PATH": path,
        "SERVE_ROWS": str(rows),
        "SERVE_USERS": ",".join(map(str, range(1, USERS + 1, 7))),
        "SERVE_MOVIES": ",".join(map(str, range(1, MOVIES + 1, 5))),
    }
    batched = _batches(url) if server == "reccompile" else None
    histograms = _histograms(url) if server == "reccompile" else None
    cpu, switches = _cpu_seconds(pid), _involuntary_switches(pid)
    subprocess.run(
        [
            *LOAD_PIN,
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(Path(__file__).with_name("serve_locust.py")),
            "--headless",
            "-u",
            str(clients),
            "-r",
            str(clients),
            "-t",
            f"{seconds:g}s",
            "--host",
            url,
            "--csv",
            str(prefix),
            "--only-summary",
            "--loglevel",
            "ERROR",
            "--stop-timeout",
            "5",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=seconds + 120,
    )
    cpu, switches = _cpu_seconds(pid) - cpu, _involuntary_switches(pid) - switches
    with open(f"{prefix}_stats.csv", newline="") as stream:
        total = next(row for row in csv.DictReader(stream) if row["Name"] == "Aggregated")
    per_s, requests = float(total["Requests/s"]), int(total["Request Count"])
    result = {
        "clients": clients,
        "rows": rows,
        "seconds": seconds,
        "requests": requests,
        "failures": int(total["Failure Count"]),
        "p50_ms": float(total["50%"]),
        "p99_ms": float(total["99%"]),
        "requests_per_s": round(per_s, 1),
        "rows_per_s": round(per_s * rows, 1),
        "server_cpu_us_per_request": round(1e6 * cpu / max(requests, 1), 1),
        "involuntary_switches_per_s": round(switches / seconds, 1),
    }
    if batched is not None:
        count, total_rows = (after - before for after, before in zip(_batches(url), batched, strict=True))
        result["mean_batch_rows"] = round(total_rows / max(count, 1), 1)
    if histograms is not None:
        result.update(_server_side(histograms, _histograms(url)))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="locust run time per point (default 8)")
    parser.add_argument("--clients", default="1,8,16,64", help="concurrent clients (default 1,8,16,64)")
    parser.add_argument("--rows", default="1,64", help="rows per request (default 1,64)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every server and predict (default 1)")
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=0.0,
        help="reccompile's batch wait (default 0, `reccompile serve`'s default)",
    )
    parser.add_argument(
        "--litserve-wait-ms", type=float, default=2.0, help="LitServe's batch_timeout in ms (default 2)"
    )
    parser.add_argument(
        "--servers", default="trivial,reccompile,litserve", help="which servers (default trivial,reccompile,litserve)"
    )
    args = parser.parse_args()
    from runtime.cpu.features import model as cpu_model

    common = {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        **PINNING,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "threads": args.threads,
        "model": SPEC.stem,
        "max_batch": 64,
    }
    results: dict[tuple[str, int, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="serve_bench_") as tmp:
        work = Path(tmp)
        export = build_export(work)
        offline = offline_predict(work, args.threads)
        print(json.dumps({**offline, **common}), flush=True)
        for server in args.servers.split(","):
            port = _free_port()
            wait = args.litserve_wait_ms if server == "litserve" else args.max_wait_ms
            process = start(server, export, args.threads, port, wait)
            try:
                for rows in map(int, args.rows.split(",")):
                    if server == "trivial" and rows != 1:
                        continue  # its answer holds one score
                    for clients in map(int, args.clients.split(",")):
                        result = {
                            "server": server,
                            **load(server, f"http://127.0.0.1:{port}", clients, rows, args.seconds, work, process.pid),
                            "max_wait_ms": wait if server != "trivial" else None,
                        }
                        results[server, clients, rows] = result
                        common["load_average_1m"] = round(os.getloadavg()[0], 2)
                        print(json.dumps({**result, **common}), flush=True)
            finally:
                stop(process)
        ours = results.get(("reccompile", 16, 1))
        at_batch = None
        if ours and ours.get("mean_batch_rows"):
            at_batch = offline_predict(work, args.threads, max(1, round(ours["mean_batch_rows"])))
            print(json.dumps({**at_batch, **common}), flush=True)
    summary: dict[str, Any] = {"offline_predict_rows_per_s": offline["rows_per_s"]}
    if at_batch:
        summary["offline_predict_rows_per_s_at_the_servers_batch"] = at_batch["rows_per_s"]
        summary["servers_mean_batch_at_16x1"] = ours["mean_batch_rows"]  # type: ignore[index]
    if ours:
        summary["serve_16x1_rows_per_s_over_predict"] = round(ours["rows_per_s"] / offline["rows_per_s"], 3)
    ceiling = results.get(("trivial", 16, 1))
    if ceiling:
        summary["trivial_16x1_rows_per_s_over_predict"] = round(ceiling["rows_per_s"] / offline["rows_per_s"], 3)
    if ours and ceiling:
        summary["serve_16x1_over_trivial"] = round(ours["rows_per_s"] / max(ceiling["rows_per_s"], 1e-9), 2)
        summary["serve_16x1_cpu_per_request_over_trivial"] = round(
            ours["server_cpu_us_per_request"] / max(ceiling["server_cpu_us_per_request"], 1e-9), 2
        )
    for server in ("reccompile", "trivial"):  # the trivial endpoint's: the tail of the machine and locust alone
        half = results.get((server, 8, 1))
        if half:
            summary[f"{'serve' if server == 'reccompile' else server}_8x1_p99_over_p50"] = round(
                half["p99_ms"] / half["p50_ms"], 2
            )
            if half.get("server_p50_ms"):
                summary["serve_8x1_server_side_p99_over_p50"] = round(half["server_p99_ms"] / half["server_p50_ms"], 2)
    theirs = results.get(("litserve", 16, 1))
    if ours and theirs:
        summary["serve_16x1_rows_per_s_over_litserve"] = round(ours["rows_per_s"] / max(theirs["rows_per_s"], 1e-9), 2)
    print(json.dumps({"summary": summary, **common}), flush=True)


if __name__ == "__main__":
    main()
