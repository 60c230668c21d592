"""The HTTP side: the Open Inference Protocol's REST endpoints on aiohttp, and serving until SIGTERM.

    GET  /v2                                   server metadata
    GET  /v2/health/live, /v2/health/ready     200 (ready: every model loaded)
    GET  /v2/models/{name}[/versions/1]        model metadata: inputs, outputs
    GET  /v2/models/{name}[/versions/1]/ready  200
    POST /v2/models/{name}[/versions/1]/infer  scores (runtime.serving.online.protocol)
    POST /v2/repository/models/{name}/load     reload the model's export(s) without a restart
    GET  /metrics                              Prometheus text (runtime.serving.online.metrics)

Errors answer `{"error": "..."}`: 400 for a bad request (naming the input
and the problem), 404 for an unknown model, 413 for a body over the limit,
503 with Retry-After when the queue is full or the server is draining.
aiohttp was chosen by measurement (see README "Serving online"): as fast as
uvicorn + starlette on a trivial endpoint here, in one package, with request
cancellation on disconnect and graceful shutdown built in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from runtime.serving.online.batcher import Overloaded
from runtime.serving.online.metrics import Metrics
from runtime.serving.online.protocol import BadRequest, decode_request, encode_response
from runtime.serving.online.registry import ReloadError, Slot
from runtime.serving.online.stalls import timing_gc, watch_loop
from runtime.serving.online.watch import watch

__all__ = ["make_app", "serve"]

LOG = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = "1"


def make_app(slots: Mapping[str, Slot], metrics: Metrics, max_body: int) -> web.Application:
    """The application serving `slots` by model name."""
    app = web.Application(client_max_size=max_body)
    reloading = asyncio.Lock()

    def slot_of(request: web.Request) -> Slot:
        name = request.match_info["name"]
        if name not in slots:
            raise _Error(404, f"unknown model {name!r} (served: {', '.join(slots)})")
        version = request.match_info.get("version")
        if version is not None and version != "1":
            raise _Error(404, f"model {name!r} has version 1 only, not {version!r}")
        return slots[name]

    async def live(_: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def server_metadata(_: web.Request) -> web.Response:
        return web.json_response({"name": "reccompile", "version": "1", "extensions": ["model_repository"]})

    async def metadata(request: web.Request) -> web.Response:
        model = slot_of(request).model
        return web.json_response(
            {
                "name": model.name,
                "versions": ["1"],
                "platform": "reccompile",
                "inputs": [{"name": i.name, "datatype": i.datatype, "shape": [-1]} for i in model.inputs],
                "outputs": [{"name": n, "datatype": d, "shape": list(s)} for n, d, s in model.outputs],
            }
        )

    async def ready(request: web.Request) -> web.Response:
        slot_of(request)
        return web.json_response({"name": request.match_info["name"], "ready": True})

    async def infer(request: web.Request) -> web.Response:
        started = time.perf_counter()
        name, code = request.match_info["name"], 500
        try:
            slot = slot_of(request)
            model = slot.model  # this request is checked against and runs on this model
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise _Error(413, f"the body is over --max-body ({max_body:,} bytes)") from None
            try:
                header = request.headers.get("Inference-Header-Content-Length")
                decoded = decode_request(body, model.inputs, model.output_names, header)
                outputs, parameters = await slot.batcher.submit((model, decoded), decoded.rows)
            except BadRequest as error:
                raise _Error(400, str(error)) from None
            except Overloaded as error:
                raise _Error(503, f"overloaded: {error}; retry later", {"Retry-After": RETRY_AFTER_SECONDS}) from None
            code = 200
            payload, json_length = encode_response(model.name, decoded, outputs, parameters)
            if json_length is None:
                return web.Response(body=payload, content_type="application/json")
            headers = {"Inference-Header-Content-Length": str(json_length)}
            return web.Response(body=payload, content_type="application/octet-stream", headers=headers)
        except web.HTTPException as error:
            code = error.status
            raise
        except asyncio.CancelledError:
            code = 499  # the client went away (nginx's code); its request was skipped if not yet run
            raise
        except Exception:
            LOG.exception("model %r failed", name)
            raise _Error(500, f"model {name!r} failed on this request; see the server's log") from None
        finally:
            if name in slots:
                metrics.request(name, code, time.perf_counter() - started)

    async def load(request: web.Request) -> web.Response:
        slot = slot_of(request)
        async with reloading:
            try:
                model = await asyncio.to_thread(slot.reload)
            except ReloadError as error:
                raise _Error(409, str(error)) from None
            except Exception as error:  # a bad or half-written export: the old model keeps serving
                raise _Error(400, f"reload of {request.match_info['name']!r} failed: {error}") from None
        return web.json_response({"name": model.name, "source": model.source, "reloaded": True})

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(
            text=metrics.text(),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Format": "version=0.0.4"},
        )

    model_paths = ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
    routes = [
        web.get("/v2", server_metadata),
        web.get("/v2/health/live", live),
        web.get("/v2/health/ready", live),
        web.get("/metrics", prometheus),
        web.post("/v2/repository/models/{name}/load", load),
    ]
    for path in model_paths:
        routes += [web.get(path, metadata), web.get(f"{path}/ready", ready), web.post(f"{path}/infer", infer)]
    app.add_routes(routes)
    return app


class _Error(web.HTTPException):
    """An error answer with a JSON body `{"error": message}` (any status)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self.status_code = status  # read by HTTPException.__init__
        super().__init__(body=json.dumps({"error": message}).encode(), content_type="application/json", headers=headers)


async def serve(
    app: web.Application,
    slots: Mapping[str, Slot],
    host: str,
    port: int,
    drain_seconds: float,
    announce: Callable[[str, str | None], None],
    on_reload: Callable[[str, BaseException | None], None],
    watch_every: float | None = None,
    grpc_port: int | None = None,
    metrics: Metrics | None = None,
    max_body: int = 4 << 20,
) -> None:
    """Serve `app` on host:port until SIGTERM or SIGINT, then stop listening, let the requests in flight
    finish (up to `drain_seconds`) and run what is queued. SIGHUP reloads every model; with
    `watch_every` (seconds) a new export in a served directory is swapped in (runtime.serving.online.watch);
    with `grpc_port` the gRPC binding listens too (runtime.serving.online.grpc_binding, counted in `metrics`).
    The event loop's stalls and the GC's pauses are recorded in `metrics` (runtime.serving.online.stalls).
    `announce(url, grpc_address)` is called once listening (the real ports when a port is 0)."""
    metrics = metrics or Metrics()
    grpc_server, grpc_address = None, None
    if grpc_port is not None:
        from runtime.serving.online.grpc_binding import start_grpc  # needs the `grpc` extra

        grpc_server, bound = await start_grpc(slots, metrics, host, grpc_port, max_body)
        grpc_address = f"{'[' + host + ']' if ':' in host else host}:{bound}"
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=drain_seconds, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    address = runner.addresses[0]
    announce(f"http://{'[' + host + ']' if ':' in host else host}:{address[1]}", grpc_address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    tasks: set[asyncio.Task] = set()

    def reload_all() -> None:
        async def one(name: str, slot: Slot) -> None:
            try:
                await asyncio.to_thread(slot.reload)
                on_reload(name, None)
            except Exception as error:
                on_reload(name, error)

        for name, slot in slots.items():
            task = loop.create_task(one(name, slot))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    loop.add_signal_handler(signal.SIGHUP, reload_all)
    watching = None if watch_every is None else loop.create_task(watch(slots, watch_every, on_reload))
    lagging = loop.create_task(watch_loop(metrics))
    with timing_gc(metrics):
        await stop.wait()
    lagging.cancel()
    if watching is not None:
        watching.cancel()
    if grpc_server is not None:
        await asyncio.gather(runner.cleanup(), grpc_server.stop(drain_seconds))
    else:
        await runner.cleanup()
    for slot in slots.values():
        await slot.batcher.stop()


def run(app: web.Application, slots: Mapping[str, Slot], **options: Any) -> None:
    asyncio.run(serve(app, slots, **options))
