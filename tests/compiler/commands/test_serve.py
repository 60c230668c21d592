"""`reccompile serve` on a tiny CSV model: scores equal `reccompile predict`'s, bad requests, tritonclient, reload.

A two-head spec (bce and mse) reads dense columns (some fields empty), a hashed string id, a
`|`-list bag and bucketized columns, trains 2 steps and is exported at fp32
and int8. The reference for every served score is `reccompile predict` of
the same rows in a CSV file with the same export: served rows go through the
readers' parsing, so they must agree to 1e-6 (predict prints 9 significant
digits), relative or absolute: float32 sums come out a few ulps apart with
the batch's size (BLAS blocks them differently), and `predict --batch-size 1`
and `--batch-size 512` already differ so on a quarter of these rows, while
the server batches whatever requests arrive together. One server serves the `live` directory for the module; a second,
slow one (500 ms batch wait, a queue of 2 rows) shows overload, client
disconnects and the SIGTERM drain.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import random
import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serving_client import Server, started_server

from compiler.cli import main

SPEC = """\
version: 1
name: tiny_ctr
features:
  dense:
    - {name: num, size: 2}
  sparse:
    - {name: city, num_embeddings: 50, dim: 4}
    - {name: tags, num_embeddings: 40, dim: 4, max_ids_per_sample: 3}
    - {name: num_bucket, count: 2, column: num, boundaries: [1, 2, 30, 50, 65], dim: 4}
model:
  deep: {type: mlp, input: [dense.num, sparse.*], layers: [8, 1], final_activation: none}
  rate: {type: mlp, input: [dense.num, sparse.*], layers: [8, 1], final_activation: none}
heads:
  - {name: click, input: deep, loss: bce}
  - {name: stars, input: rate, loss: mse, label: rating}
training:
  batch_size: 32
  dense_optimizer: {type: adagrad, lr: 0.5}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.5}
data:
  reader: csv
  path: rows.csv
  columns: {age: num, income: num, city: city, tags: tags, clicked: click, rating: rating}
"""
HEADER = ["age", "income", "city", "tags", "clicked", "rating"]
INPUTS = {"age": "FP32", "income": "FP32", "city": "BYTES", "tags": "BYTES"}
ROWS = 80


def _rows() -> list[list[str]]:
    rng = random.Random(0)
    cities = ["paris", "lyon", "nice", "lille", "brest", "7"]
    return [
        [
            str(rng.randint(18, 80)),
            "" if i % 9 == 4 else f"{rng.uniform(0, 5):.3f}",
            rng.choice(cities),
            "|".join(str(rng.randint(0, 30)) for _ in range(rng.randint(0, 3))),
            str(rng.randint(0, 1)),
            str(rng.randint(1, 5)),
        ]
        for i in range(ROWS)
    ]


def _predicted(work: Path, export: str) -> list[list[float]]:
    output = work / f"{export}.csv"
    assert main(["predict", str(work / export), "--data", f"csv:{work / 'rows.csv'}", "-o", str(output)]) == 0
    with open(output, newline="") as stream:
        return [[float(v) for v in row[2:]] for row in list(csv.reader(stream))[1:]]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve")
    rows = _rows()
    with open(root / "rows.csv", "w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows([HEADER, *rows])
    (root / "spec.yaml").write_text(SPEC)
    assert (
        main(
            [
                "train",
                str(root / "spec.yaml"),
                "--data",
                f"csv:{root / 'rows.csv'}",
                "--data-workers",
                "0",
                "--steps",
                "2",
                "--log-every",
                "2",
                "--checkpoint-dir",
                str(root / "ckpt"),
                "--checkpoint-every",
                "2",
                "-o",
                str(root / "build"),
            ]
        )
        == 0
    )
    for name, precision in (("fp32", "none"), ("int8", "int8")):
        assert (
            main(
                [
                    "export",
                    str(root / "spec.yaml"),
                    "--checkpoint",
                    str(root / "ckpt"),
                    "--quantize",
                    precision,
                    "--no-aot",
                    "-o",
                    str(root / name),
                ]
            )
            == 0
        )
    shutil.copytree(root / "fp32", root / "live")
    return root


@pytest.fixture(scope="module")
def reference(work: Path) -> dict[str, list[list[float]]]:
    return {name: _predicted(work, name) for name in ("fp32", "int8")}


@pytest.fixture(scope="module")
def server(work: Path) -> Any:
    with started_server([work / "live", "--max-wait-ms", "2", "--max-body", "4096"]) as running:
        yield running


def _request(rows: list[list[str]], **extra: Any) -> dict[str, Any]:
    """An infer request of raw CSV rows: numbers as numbers (an empty one as null), text as strings."""
    inputs = []
    for name, datatype in INPUTS.items():
        column = HEADER.index(name)
        data = [(float(row[column]) if row[column] else None) if datatype == "FP32" else row[column] for row in rows]
        inputs.append({"name": name, "datatype": datatype, "shape": [len(rows)], "data": data})
    return {"inputs": inputs, **extra}


def _scores(body: dict[str, Any]) -> list[list[float]]:
    outputs = {o["name"]: o["data"] for o in body["outputs"]}
    return [list(pair) for pair in zip(outputs["click"], outputs["stars"], strict=True)]


def test_metadata_health_and_readiness(server: Server) -> None:
    assert server.url.startswith("http://127.0.0.1:")  # without --host, this machine only
    assert server.call("GET", "/v2/health/live")[0] == 200
    assert server.call("GET", "/v2/health/ready")[0] == 200
    assert server.call("GET", "/v2/models/tiny_ctr/ready")[:1] == (200,)
    status, _, body = server.call("GET", "/v2/models/tiny_ctr")
    assert status == 200 and body == {
        "name": "tiny_ctr",
        "versions": ["1"],
        "platform": "reccompile",
        "inputs": [{"name": n, "datatype": d, "shape": [-1]} for n, d in INPUTS.items()],
        "outputs": [
            {"name": "click", "datatype": "FP32", "shape": [-1]},
            {"name": "stars", "datatype": "FP32", "shape": [-1]},
        ],
    }
    assert server.call("GET", "/v2/models/other")[::2] == (404, {"error": "unknown model 'other' (served: tiny_ctr)"})
    assert server.call("GET", "/v2")[::2] == (
        200,
        {"name": "reccompile", "version": "1", "extensions": ["model_repository"]},
    )
    assert server.call("GET", "/v2/models/tiny_ctr/versions/1")[::2] == (200, body)
    assert server.call("GET", "/v2/models/tiny_ctr/versions/2/ready")[::2] == (
        404,
        {"error": "model 'tiny_ctr' has version 1 only, not '2'"},
    )
    status, _, answer = server.call("POST", "/v2/models/tiny_ctr/versions/1/infer", _request(_rows()[:1]))
    assert (status, answer["model_version"], [o["shape"] for o in answer["outputs"]]) == (200, "1", [[1], [1]])


def test_served_scores_equal_predicts_from_concurrent_requests_of_every_size(
    server: Server, work: Path, reference
) -> None:
    rows = _rows()
    cuts = [0, 1, 4, 5, 12, 13, 40, 41, 60, ROWS]  # requests of 1 to 27 rows, sent at once: batched together
    got: dict[int, list[list[float]]] = {}

    def send(lo: int, hi: int) -> None:
        status, _, body = server.call("POST", "/v2/models/tiny_ctr/infer", _request(rows[lo:hi], id=f"r{lo}"))
        assert status == 200 and body["id"] == f"r{lo}", body
        got[lo] = _scores(body)

    before = server.metric('reccompile_requests_total{model="tiny_ctr",code="200"}')
    threads = [threading.Thread(target=send, args=pair) for pair in itertools.pairwise(cuts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    served = [scores for lo in sorted(got) for scores in got[lo]]
    assert len(served) == ROWS
    assert np.allclose(served, reference["fp32"], rtol=1e-6, atol=1e-6)
    assert server.metric('reccompile_requests_total{model="tiny_ctr",code="200"}') == before + len(threads)


BAD = [
    (b"{", "malformed JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ({"inputs": 3}, "the body must be a JSON object with a list 'inputs'"),
    (
        {"inputs": _request([["30", "1.5", "paris", "1|2", "0", "1"]])["inputs"][:3]},
        "input 'tags' is missing (the model's inputs: age, income, city, tags)",
    ),
    (
        {"inputs": [{"name": "city", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
        "input 'city': datatype 'FP32', expected BYTES or INT64 or INT32",
    ),
    (
        {"inputs": [{"name": "age", "datatype": "FP32", "shape": [2], "data": [1.0]}]},
        "input 'age': shape [2] but 1 values in 'data'",
    ),
    (
        {"inputs": [{"name": "age", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]},
        "input 'age': shape [1, 2], expected [N] (one value per row)",
    ),
    (
        {
            "inputs": [
                {"name": "age", "datatype": "FP32", "shape": [1], "data": [1.0]},
                {"name": "income", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]},
            ]
        },
        "input 'income': shape [2], but input 'age' has shape [1]",
    ),
    (
        {"inputs": [{"name": "agee", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
        "input 'agee': the model has no such input (its inputs: age, income, city, tags)",
    ),
    (
        {"inputs": [{"name": "age", "datatype": "FP32", "shape": [1], "data": ["x"]}]},
        "input 'age', row 0: \"x\" is not a finite number",
    ),
    (
        _request([["30", "1.5", "paris", "1|2", "0", "1"], ["30", "1.5", "paris", "1|2|3|4", "0", "1"]]),
        "input 'tags', row 1: 4 ids, but feature 'tags' takes at most 3 (max_ids_per_sample) (got '1|2|3|4')",
    ),
    (
        _request([["30", "1.5", "paris", "1", "0", "1"]], outputs=[{"name": "clicks"}]),
        "output 'clicks': the model has no such output (its outputs: click, stars)",
    ),
]


@pytest.mark.parametrize("body, message", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_a_bad_request_answers_400_naming_the_input_and_the_problem(server: Server, body: Any, message: str) -> None:
    assert server.call("POST", "/v2/models/tiny_ctr/infer", body)[::2] == (400, {"error": message})


def test_a_bad_request_does_not_fail_the_good_ones_batched_with_it(server: Server, reference) -> None:
    rows = _rows()
    bad = _request([["30", "1.5", "paris", "1|2|3|4", "0", "1"]])
    answers: dict[str, tuple] = {}

    def send(key: str, body: dict[str, Any]) -> None:
        answers[key] = server.call("POST", "/v2/models/tiny_ctr/infer", body)

    threads = [threading.Thread(target=send, args=pair) for pair in (("good", _request(rows[:3])), ("bad", bad))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers["bad"][0] == 400
    assert answers["good"][0] == 200 and np.allclose(
        _scores(answers["good"][2]), reference["fp32"][:3], rtol=1e-6, atol=1e-6
    )


def test_a_body_over_max_body_answers_413(server: Server) -> None:
    body = _request([["30", "1.5", "paris", "1|2", "0", "1"]] * 300)  # about 7 kB
    assert server.call("POST", "/v2/models/tiny_ctr/infer", body)[::2] == (
        413,
        {"error": "the body is over --max-body (4,096 bytes)"},
    )
    assert server.call("GET", "/v2/health/live")[0] == 200


def test_tritonclient_works_unchanged_binary_and_json(server: Server, reference) -> None:
    import tritonclient.http as triton

    rows = _rows()[5:10]  # no empty field: binary FP32 has no null
    client = triton.InferenceServerClient(url="{}:{}".format(*server.address))
    assert client.is_server_live() and client.is_model_ready("tiny_ctr")
    assert [i["name"] for i in client.get_model_metadata("tiny_ctr")["inputs"]] == list(INPUTS)
    for binary in (True, False):
        inputs = []
        for name, datatype in INPUTS.items():
            column = [row[HEADER.index(name)] for row in rows]
            array = (
                np.array(column, dtype=np.float32)
                if datatype == "FP32"
                else np.array([v.encode() for v in column], dtype=np.object_)
            )
            tensor = triton.InferInput(name, [len(rows)], datatype)
            tensor.set_data_from_numpy(array, binary_data=binary)
            inputs.append(tensor)
        outputs = None if binary else [triton.InferRequestedOutput(h, binary_data=False) for h in ("click", "stars")]
        result = client.infer("tiny_ctr", inputs, outputs=outputs)
        served = np.stack([result.as_numpy("click"), result.as_numpy("stars")], axis=1)
        assert served.dtype == np.float32 and np.allclose(served, reference["fp32"][5:10], rtol=1e-6, atol=1e-6)


def test_grpc_binding_answers_tritonclient_and_typed_contents_with_predicts_scores(work: Path, reference) -> None:
    import grpc
    import tritonclient.grpc as triton
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    from tritonclient.utils import InferenceServerException

    rows = _rows()[5:10]  # no empty field: binary FP32 has no null
    with started_server([work / "fp32", "--grpc-port", "0"]) as running:
        address = next(line.split()[-1] for line in running.lines if line.startswith("gRPC on "))
        assert address.startswith("127.0.0.1:")
        client = triton.InferenceServerClient(url=address)
        assert client.is_server_live() and client.is_model_ready("tiny_ctr") and not client.is_model_ready("other")
        assert [i.name for i in client.get_model_metadata("tiny_ctr").inputs] == list(INPUTS)
        inputs = []
        for name, datatype in INPUTS.items():
            column = [row[HEADER.index(name)] for row in rows]
            tensor = triton.InferInput(name, [len(rows)], datatype)
            tensor.set_data_from_numpy(
                np.array(column, dtype=np.float32)
                if datatype == "FP32"
                else np.array([v.encode() for v in column], dtype=np.object_)
            )
            inputs.append(tensor)
        result = client.infer("tiny_ctr", inputs)
        served = np.stack([result.as_numpy("click"), result.as_numpy("stars")], axis=1)
        assert served.dtype == np.float32 and np.allclose(served, reference["fp32"][5:10], rtol=1e-6, atol=1e-6)
        with pytest.raises(InferenceServerException) as missing:
            client.infer("tiny_ctr", inputs[:3])
        assert (missing.value.status(), missing.value.message()) == (
            "StatusCode.INVALID_ARGUMENT",
            "input 'tags' is missing (the model's inputs: age, income, city, tags)",
        )
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("other", inputs)
        assert (unknown.value.status(), unknown.value.message()) == (
            "StatusCode.NOT_FOUND",
            "unknown model 'other' (served: tiny_ctr)",
        )
        # Typed contents rather than raw bytes, the stubs called directly, one output asked for.
        request = service_pb2.ModelInferRequest(model_name="tiny_ctr", id="typed")
        for name, datatype in INPUTS.items():
            tensor = request.inputs.add(name=name, datatype=datatype, shape=[len(rows)])
            column = [row[HEADER.index(name)] for row in rows]
            if datatype == "FP32":
                tensor.contents.fp32_contents.extend(float(v) for v in column)
            else:
                tensor.contents.bytes_contents.extend(v.encode() for v in column)
        request.outputs.add(name="stars")
        with grpc.insecure_channel(address) as channel:
            answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        assert (answer.id, [o.name for o in answer.outputs], list(answer.outputs[0].shape)) == ("typed", ["stars"], [5])
        stars = np.frombuffer(answer.raw_output_contents[0], dtype="<f4")
        assert np.allclose(stars, [r[1] for r in reference["fp32"][5:10]], rtol=1e-6, atol=1e-6)
        assert running.metric('reccompile_requests_total{model="tiny_ctr",code="200"}') == 2


def test_reload_under_load_swaps_the_export_with_no_failed_request(server: Server, work: Path, reference) -> None:
    rows = _rows()
    failures: list[Any] = []
    answered: list[tuple[int, list[float]]] = []
    swapped = threading.Event()

    def client(first: int) -> None:
        for i in range(first, first + 40):  # bounded; keeps going while the export is swapped
            status, _, body = server.call("POST", "/v2/models/tiny_ctr/infer", _request([rows[i % ROWS]]))
            if status != 200:
                failures.append((status, body))
            else:
                answered.append((i % ROWS, _scores(body)[0]))
            if i == first + 10:
                swapped.wait(timeout=30)

    clients = [threading.Thread(target=client, args=(k * 17,)) for k in range(4)]
    for thread in clients:
        thread.start()
    time.sleep(0.2)
    (work / "live").rename(work / "old")  # the served directory is replaced by the int8 export, then reloaded
    shutil.copytree(work / "int8", work / "live")
    status, _, body = server.call("POST", "/v2/repository/models/tiny_ctr/load")
    swapped.set()
    for thread in clients:
        thread.join()
    assert status == 200 and body == {"name": "tiny_ctr", "source": str(work / "live"), "reloaded": True}
    assert failures == [] and len(answered) == 160
    for row, scores in answered:  # every answer is one model's or the other's, never a mix
        assert np.allclose(scores, reference["fp32"][row], rtol=1e-6, atol=1e-6) or np.allclose(
            scores, reference["int8"][row], rtol=1e-6, atol=1e-6
        )
    status, _, body = server.call("POST", "/v2/models/tiny_ctr/infer", _request(rows))
    assert np.allclose(_scores(body), reference["int8"], rtol=1e-6, atol=1e-6)
    assert not np.allclose(reference["int8"], reference["fp32"], rtol=1e-6, atol=1e-6)  # the swap is visible
    assert server.metric('reccompile_reloads_total{model="tiny_ctr"}') == 1


def test_a_reload_of_a_broken_export_keeps_the_old_model_serving(server: Server, work: Path) -> None:
    (work / "live" / "manifest.json").rename(work / "live" / "manifest.moved")
    try:
        status, _, body = server.call("POST", "/v2/repository/models/tiny_ctr/load")
    finally:
        (work / "live" / "manifest.moved").rename(work / "live" / "manifest.json")
    assert status == 400 and body["error"].startswith("reload of 'tiny_ctr' failed: ")
    assert server.call("POST", "/v2/models/tiny_ctr/infer", _request(_rows()[:1]))[0] == 200


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _until(condition: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.1)


def test_watch_swaps_in_a_complete_export_and_refuses_an_incomplete_or_corrupt_one(work: Path, reference) -> None:
    watched, staged = work / "watched", work / "staged"
    shutil.copytree(work / "fp32", watched)
    shutil.copytree(work / "int8", staged)
    weights = max((p for p in (staged / "weights").iterdir()), key=lambda p: p.stat().st_size)
    good = weights.read_bytes()
    weights.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])  # same size, another sha256
    rows = _rows()
    with started_server([watched, "--watch", "--watch-every", "0.2"]) as running:

        def scores() -> list[list[float]]:
            status, _, body = running.call("POST", "/v2/models/tiny_ctr/infer", _request(rows))
            assert status == 200
            return _scores(body)

        def failures() -> float:
            return running.metric('reccompile_reload_failures_total{model="tiny_ctr"}')

        shutil.copy(work / "int8" / "manifest.json", watched / "manifest.json")  # incomplete: its files not there
        _until(lambda: failures() >= 1)
        assert np.allclose(scores(), reference["fp32"], rtol=1e-6, atol=1e-6)  # the old model serves on
        time.sleep(0.6)  # nothing changed: not tried again
        assert failures() == 1
        shutil.copytree(staged, watched, dirs_exist_ok=True)  # complete but one weights file corrupt
        _until(lambda: failures() >= 2)
        assert np.allclose(scores(), reference["fp32"], rtol=1e-6, atol=1e-6)
        assert running.metric('reccompile_reloads_total{model="tiny_ctr"}') == 0
        (watched / "weights" / weights.name).write_bytes(good)  # mended: the new export is whole
        _until(lambda: running.metric('reccompile_reloads_total{model="tiny_ctr"}') == 1)
        assert np.allclose(scores(), reference["int8"], rtol=1e-6, atol=1e-6)
        status, output = running.stop()
    assert status == 0
    lines = output.splitlines()
    refused = [line for line in lines if line.startswith("error: reload of 'tiny_ctr' failed: ")]

    def mismatch(name: str, found: bytes, listed: bytes) -> str:
        return (
            f"error: reload of 'tiny_ctr' failed: {watched / name}: sha256 {_sha(found)[:12]}… does not match "
            f"manifest.json ({_sha(listed)[:12]}…); the file was changed or corrupted, export again; "
            "the previous export keeps serving"
        )

    module = (work / "fp32" / "tiny_ctr.py").read_bytes(), (work / "int8" / "tiny_ctr.py").read_bytes()
    assert refused[0] == mismatch("tiny_ctr.py", *module)
    assert refused[-1] == mismatch(f"weights/{weights.name}", weights.read_bytes(), good)
    assert lines[-2:] == ["reloaded 'tiny_ctr'", "stopped: every request answered"]


def test_metrics_are_prometheus_text(server: Server) -> None:
    status, headers, text = server.call("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for family, kind in (
        ("reccompile_requests_total", "counter"),
        ("reccompile_request_errors_total", "counter"),
        ("reccompile_request_seconds", "histogram"),
        ("reccompile_batch_rows", "histogram"),
        ("reccompile_queue_rows", "gauge"),
        ("reccompile_batch_seconds", "histogram"),
        ("reccompile_batch_cpu_seconds", "histogram"),
        ("reccompile_loop_lag_seconds", "histogram"),
        ("reccompile_gc_seconds", "histogram"),
    ):
        assert f"# TYPE {family} {kind}\n" in text
    batches = server.metric('reccompile_batch_rows_count{model="tiny_ctr"}')
    assert server.metric('reccompile_batch_seconds_count{model="tiny_ctr"}') == batches > 0
    assert server.metric('reccompile_batch_cpu_seconds_count{model="tiny_ctr"}') == batches
    # The loop's timer keeps counting between scrapes: its bucket and count are read from one scrape.
    lag = dict(re.findall(r"^reccompile_loop_lag_seconds_(count|bucket\{le=\"\+Inf\"\}) (\S+)$", text, re.M))
    assert float(lag["count"]) > 0 and lag['bucket{le="+Inf"}'] == lag["count"]
    count = server.metric('reccompile_request_seconds_count{model="tiny_ctr"}')
    inf = server.metric('reccompile_request_seconds_bucket{model="tiny_ctr",le="+Inf"}')
    answered = sum(server.metric(f'reccompile_requests_total{{model="tiny_ctr",code="{c}"}}') for c in (200, 400, 413))
    assert count == inf == answered > 0
    assert server.metric('reccompile_request_errors_total{model="tiny_ctr",code="400"}') >= len(BAD)
    assert server.metric('reccompile_batch_rows_sum{model="tiny_ctr"}') >= ROWS


# The slow server: every batch waits 500 ms for company, 2 rows queue at most.


@pytest.fixture(scope="module")
def slow(work: Path) -> Any:
    with started_server([work / "fp32", "--max-wait-ms", "500", "--max-queue", "2"]) as running:
        yield running


def _in_background(call: Any) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    return thread, result


def test_overload_answers_503_with_retry_after_and_never_hangs(slow: Server) -> None:
    one = _request(_rows()[:1])
    waiting = [_in_background(lambda: slow.call("POST", "/v2/models/tiny_ctr/infer", one)) for _ in range(2)]
    time.sleep(0.2)  # both queued, waiting for their batch
    started = time.perf_counter()
    status, headers, body = slow.call("POST", "/v2/models/tiny_ctr/infer", one)
    assert time.perf_counter() - started < 0.4
    assert (status, headers["Retry-After"], body) == (
        503,
        "1",
        {"error": "overloaded: 2 rows are queued (--max-queue 2); retry later"},
    )
    for thread, result in waiting:
        thread.join()
        assert result[0][0] == 200


def test_a_client_that_disconnects_costs_no_model_time(slow: Server) -> None:
    body = json.dumps(_request(_rows()[:1])).encode()
    batches = slow.metric('reccompile_batch_rows_count{model="tiny_ctr"}')
    with socket.create_connection(slow.address) as sock:
        sock.sendall(
            b"POST /v2/models/tiny_ctr/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        time.sleep(0.1)
    time.sleep(0.8)  # its batch was due 500 ms after it arrived
    assert slow.metric('reccompile_cancelled_total{model="tiny_ctr"}') == 1
    assert slow.metric('reccompile_requests_total{model="tiny_ctr",code="499"}') == 1
    assert slow.metric('reccompile_batch_rows_count{model="tiny_ctr"}') == batches
    assert slow.call("GET", "/v2/health/live")[0] == 200


def test_sighup_reloads_every_model(slow: Server) -> None:
    slow.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while slow.metric('reccompile_reloads_total{model="tiny_ctr"}') < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slow.metric('reccompile_reloads_total{model="tiny_ctr"}') == 1


def test_sigterm_finishes_the_requests_in_flight_then_exits(slow: Server, reference) -> None:
    thread, result = _in_background(lambda: slow.call("POST", "/v2/models/tiny_ctr/infer", _request(_rows()[:2])))
    time.sleep(0.2)  # queued, its batch 300 ms away
    status, output = slow.stop()
    thread.join()
    assert result[0][0] == 200 and np.allclose(_scores(result[0][2]), reference["fp32"][:2], rtol=1e-6, atol=1e-6)
    assert status == 0 and output.endswith("reloaded 'tiny_ctr'\nstopped: every request answered\n")


# The command line, without a server.


def test_serve_without_aiohttp_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, capsys, work: Path) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "aiohttp" else find_spec(name, *a)
    )
    assert main(["serve", str(work / "fp32")]) == 1
    assert capsys.readouterr().err == (
        "error: reccompile serve needs the aiohttp package: pip install 'reccompile[serve]' (or: pip install aiohttp)\n"
    )


def test_grpc_port_without_grpcio_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, capsys, work: Path) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else find_spec(name, *a))
    assert main(["serve", str(work / "fp32"), "--grpc-port", "0"]) == 1
    assert capsys.readouterr().err == (
        "error: --grpc-port needs the grpcio and tritonclient packages: "
        "pip install 'reccompile[grpc]' (or: pip install grpcio 'tritonclient[grpc]')\n"
    )
    assert main(["serve", str(work / "fp32"), "--watch", "--watch-every", "0"]) == 2
    assert capsys.readouterr().err == "error: --watch-every 0: must be a number of seconds above 0\n"


def test_serve_refuses_bad_usage_and_an_export_it_cannot_serve(capsys, work: Path) -> None:
    assert main(["serve"]) == 2
    assert (
        capsys.readouterr().err
        == "error: give an export directory OUT to serve, or --pipeline RETRIEVAL_OUT RANKING_OUT\n"
    )
    assert main(["serve", str(work / "missing")]) == 1
    assert capsys.readouterr().err == f"error: export directory {work / 'missing'} does not exist\n"
    assert main(["serve", "--pipeline", str(work / "fp32"), str(work / "fp32")]) == 1
    assert (
        capsys.readouterr().err
        == f"error: {work / 'fp32'}: not a retrieval export (no sampled_softmax head, no index)\n"
    )
